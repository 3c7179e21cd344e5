// Split specs: the grammar, validation with clear errors, the rounding of fractions to rows
// against the exact shares, and the file of per-layer splits; comma-separated lists.
#include <stdlib.h>
#include <sys/stat.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/core/text.h"
#include "lib/scheduler/split.h"
#include "tests/support.h"

namespace hn {
namespace {

namespace fs = std::filesystem;

TEST_CASE("split_commas gives the items between commas, keeping or dropping empty ones") {
  using detail::EmptyItems;
  using detail::split_commas;
  using List = std::vector<std::string>;
  CHECK(split_commas("", EmptyItems::keep).empty());
  CHECK(split_commas("", EmptyItems::drop).empty());
  CHECK(split_commas("a", EmptyItems::keep) == List{"a"});
  CHECK(split_commas("a,bc,,d", EmptyItems::keep) == List{"a", "bc", "", "d"});
  CHECK(split_commas("a,bc,,d", EmptyItems::drop) == List{"a", "bc", "d"});
  CHECK(split_commas(",a,", EmptyItems::keep) == List{"", "a", ""});
  CHECK(split_commas(",a,", EmptyItems::drop) == List{"a"});
  CHECK(split_commas(",", EmptyItems::drop).empty());
}
using test::TempDir;

std::string contents(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST_CASE("Split parses devices with fractions in both spellings") {
  const Split a = Split::parse("cuda:0:0.6,cpu:0.4");
  REQUIRE(a.shares().size() == 2);
  CHECK(a.shares()[0].device == Device::parse("cuda:0"));
  CHECK(a.shares()[0].fraction == 0.6);
  CHECK(a.shares()[1].device == Device::parse("cpu"));
  CHECK(a.to_string() == "cuda:0:0.6,cpu:0.4");
  CHECK(Split::parse("cpu").to_string() == "cpu:1.0");
  const Split b = Split::parse(" cuda:0 = 0.25 , reference=0.75 ");
  CHECK(b.shares()[1].device == Device::parse("reference"));
  CHECK(b.shares()[1].fraction == 0.75);
  // One entry may leave out its fraction; a lone device gets everything.
  const Split c = Split::parse("cuda:0,cpu:0.3");
  CHECK(c.shares()[0].fraction == Approx(0.7));
  CHECK(Split::parse("cpu").shares()[0].fraction == 1.0);
  // Integers after a bare kind are device indices; fractions have a point or follow a full
  // device name.
  CHECK(Split::parse("cpu:1").shares()[0].device == Device::parse("cpu:1"));
  CHECK(Split::parse("cpu:1.0").shares()[0].device == Device::parse("cpu"));
  CHECK(Split::parse("cuda:1").shares()[0].device == Device::parse("cuda:1"));
  CHECK(Split::parse("cuda:1:1").shares()[0].device == Device::parse("cuda:1"));
  CHECK(Split::parse("reference:1.0,cpu:0.0").shares()[1].fraction == 0.0);
  CHECK(Split::parse("reference:0.5,cpu:0").shares()[1].fraction == 0.5);
  CHECK(Split::parse("auto").is_automatic());
  // to_string reads back as the same split.
  for (const char* text : {"cpu:1.0", "cuda:1:1,cpu:0.0", "reference:0.25,cpu:3:0.75"}) {
    const Split split = Split::parse(text);
    const Split again = Split::parse(split.to_string());
    REQUIRE(again.shares().size() == split.shares().size());
    for (std::size_t i = 0; i < split.shares().size(); ++i) {
      CHECK(again.shares()[i].device == split.shares()[i].device);
      CHECK(again.shares()[i].fraction == split.shares()[i].fraction);
    }
  }
  CHECK(Split().empty());
}

TEST_CASE("Split rejects bad fractions and repeated or unknown devices, quoting the spec") {
  CHECK_THROWS_WITH(Split::parse("cpu:0.6,reference:0.6"),
                    Catch::Contains("cpu:0.6,reference:0.6") && Catch::Contains("sum to 1.2"));
  CHECK_THROWS_WITH(Split::parse("cpu:-0.5,reference:1.5"), Catch::Contains("non-negative"));
  CHECK_THROWS_WITH(Split::parse("cpu:0.5,cpu:0.5"), Catch::Contains("cpu appears twice"));
  CHECK_THROWS_WITH(Split::parse("tpu:0.5,cpu:0.5"),
                    Catch::Contains("tpu:0.5,cpu:0.5") && Catch::Contains("unknown device"));
  CHECK_THROWS_WITH(Split::parse("cpu:0.5,,reference:0.5"), Catch::Contains("empty entry"));
  CHECK_THROWS_WITH(Split::parse("cpu,reference"), Catch::Contains("only one device"));
  CHECK_THROWS_WITH(Split::parse("cpu=half"), Catch::Contains("'half' is not a fraction"));
  CHECK_THROWS_AS(Split(std::vector<SplitShare>{}), Error);
}

TEST_CASE("Split partition gives contiguous slices within one row of the exact shares") {
  const Split splits[] = {
      Split::parse("cpu:1.0,reference:0.0"),           Split::parse("cpu:0.0,reference:1.0"),
      Split::parse("cpu:0.5,reference:0.5"),           Split::parse("cpu:0.75,reference:0.25"),
      Split::parse("cpu:0.2,reference:0.3,cpu:1:0.5"), Split::parse("cpu:0.01,reference:0.99")};
  for (const Split& split : splits) {
    for (index_t rows : {0, 1, 2, 3, 7, 31, 64, 101}) {
      INFO(split.to_string() << " rows " << rows);
      const auto slices = split.partition(rows);
      REQUIRE(slices.size() == split.shares().size());
      index_t next = 0;
      double cumulative = 0.0;
      for (std::size_t i = 0; i < slices.size(); ++i) {
        CHECK(slices[i].first == next);
        CHECK(slices[i].second >= slices[i].first);
        const double exact = split.shares()[i].fraction * static_cast<double>(rows);
        CHECK(std::fabs(static_cast<double>(slices[i].second - slices[i].first) - exact) <= 1.0);
        cumulative += split.shares()[i].fraction;
        // Boundaries are the cumulative share rounded half up.
        if (i + 1 < slices.size()) {
          CHECK(slices[i].second ==
                static_cast<index_t>(std::floor(cumulative * static_cast<double>(rows) + 0.5)));
        }
        next = slices[i].second;
      }
      CHECK(next == rows);
    }
  }
  // 3:1 of an odd batch: 7 * 0.75 = 5.25 -> 5 and 2.
  const auto slices = Split::parse("cpu:0.75,reference:0.25").partition(7);
  CHECK(slices[0] == std::pair<index_t, index_t>{0, 5});
  CHECK(slices[1] == std::pair<index_t, index_t>{5, 7});
}

TEST_CASE(
    "Split proportional shares by weight with the last taking the rest, and only lists every "
    "device") {
  const std::vector<Device> devices{Device::parse("cpu"), Device::parse("cpu:1"),
                                    Device::parse("reference")};
  const Split split = Split::proportional(devices, {1.0, 1.0, 2.0});
  REQUIRE(split.shares().size() == 3);
  CHECK(split.shares()[0].fraction == 0.25);
  CHECK(split.shares()[1].fraction == 0.25);
  CHECK(split.shares()[2].fraction == 0.5);
  // Thirds do not sum to 1 in floating point: the last takes 1 - the others.
  const Split thirds = Split::proportional(devices, {1.0, 1.0, 1.0});
  CHECK(thirds.shares()[2].fraction == 1.0 - (1.0 / 3.0 + 1.0 / 3.0));
  CHECK_THROWS_WITH(Split::proportional(devices, {1.0}), Catch::Contains("3 devices, 1 weights"));
  CHECK(Split::only(devices, devices[1]).to_string() == "cpu:0.0,cpu:1:1.0,reference:0.0");
}

TEST_CASE("Split balanced gives each device rows in proportion to its speed in a timing") {
  // 17 and 15 of 32 rows, each device as fast as the other (17 rows in 0.34 s, 15 in
  // 0.30 s: 50 rows a second each): halves.
  const Split uneven = Split::parse("cpu:0.53,cpu:1:0.47");
  REQUIRE(uneven.partition(32)[0].second == 17);
  const Split halves = uneven.balanced(32, {0.34, 0.30});
  REQUIRE(halves.shares().size() == 2);
  CHECK(halves.shares()[0].device.name() == "cpu");
  CHECK(halves.shares()[0].fraction == Approx(0.5).epsilon(1e-12));
  CHECK(halves.partition(32)[0] == std::pair<index_t, index_t>{0, 16});
  // 16 rows in 0.2 s (80/s) and 16 in 0.6 s (26.7/s): 3 to 1.
  const Split three_to_one = Split::parse("cpu:0.5,cpu:1:0.5").balanced(32, {0.2, 0.6});
  CHECK(three_to_one.shares()[0].fraction == Approx(0.75).epsilon(1e-12));
  // A device without rows keeps none, whatever its busy time; one with rows and no busy
  // time leaves nothing to go by.
  const Split one_idle = Split::parse("cpu:0.0,cpu:1:0.5,reference:0.5");
  const Split kept_out = one_idle.balanced(8, {0.0, 0.1, 0.3});
  CHECK(kept_out.shares()[0].fraction == 0.0);
  CHECK(kept_out.shares()[1].fraction == Approx(0.75).epsilon(1e-12));
  CHECK(one_idle.balanced(8, {0.0, 0.0, 0.3}).empty());
  CHECK_THROWS_WITH(halves.balanced(32, {0.1}), Catch::Contains("2 shares, 1 busy times"));
}

TEST_CASE("Split check_devices names a device without a driver and those present") {
  Runtime runtime;
  runtime.add(Device::parse("reference"));
  Split::parse("reference").check_devices(runtime);
  CHECK_THROWS_WITH(Split::parse("reference:0.5,cuda:3:0.5").check_devices(runtime),
                    Catch::Contains("cuda:3") && Catch::Contains("present: reference"));
}

TEST_CASE("Split auto names the devices to measure and reads back from to_string") {
  const Split all = Split::parse("auto");
  CHECK(all.is_automatic());
  CHECK_FALSE(all.empty());
  CHECK(all.automatic_devices().empty());
  CHECK(all.shares().empty());
  CHECK(all.to_string() == "auto");
  const Split some = Split::parse(" auto: cpu , reference ");
  REQUIRE(some.automatic_devices().size() == 2);
  CHECK(some.automatic_devices()[0] == Device{"cpu", 0});
  CHECK(some.automatic_devices()[1] == Device{"reference", 0});
  CHECK(some.to_string() == "auto:cpu,reference");
  for (const char* text : {"auto", "auto:cpu,reference", "auto:cpu,cuda:0", "auto:cpu:1"}) {
    const Split again = Split::parse(Split::parse(text).to_string());
    CHECK(again.is_automatic());
    CHECK(again.to_string() == text);
  }
  CHECK(Split::automatic({Device{"cuda", 1}, Device{"cpu", 0}}).to_string() == "auto:cuda:1,cpu");
  CHECK_THROWS_WITH(all.partition(8), Catch::Contains("auto"));
}

TEST_CASE("Split auto rejects a repeated, unknown or missing device, quoting the spec") {
  CHECK_THROWS_WITH(Split::parse("auto:cpu,cpu"),
                    Catch::Contains("'auto:cpu,cpu'") && Catch::Contains("cpu appears twice"));
  CHECK_THROWS_WITH(Split::parse("auto:cpu,tpu"),
                    Catch::Contains("'auto:cpu,tpu'") && Catch::Contains("unknown device"));
  CHECK_THROWS_WITH(Split::parse("auto:"),
                    Catch::Contains("'auto:'") && Catch::Contains("empty entry"));
  CHECK_THROWS_WITH(Split::parse("auto:cpu,,reference"), Catch::Contains("empty entry"));
  CHECK_THROWS_WITH(Split::automatic({Device{"reference", 0}, Device{"reference", 0}}),
                    Catch::Contains("reference appears twice"));
}

TEST_CASE("Split to_string of measured fractions reads back as the same text") {
  // Three thirds written with 6 digits each would sum to 0.999999, outside the tolerance:
  // the last share is written as what the others leave.
  const double third = 1.0 / 3.0;
  const Split thirds({SplitShare{Device{"cpu", 0}, third},
                      SplitShare{Device{"reference", 0}, third},
                      SplitShare{Device{"cpu", 1}, third}});
  CHECK(thirds.to_string() == "cpu:0.333333,reference:0.333333,cpu:1:0.333334");
  const Split measured({SplitShare{Device{"cpu", 0}, 0.9712345678},
                        SplitShare{Device{"reference", 0}, 1.0 - 0.9712345678}});
  CHECK(measured.to_string() == "cpu:0.971235,reference:0.028765");
  for (const Split& split : {thirds, measured}) {
    const Split again = Split::parse(split.to_string());
    CHECK(again.to_string() == split.to_string());
    for (std::size_t i = 0; i < split.shares().size(); ++i)
      CHECK(again.shares()[i].fraction == Approx(split.shares()[i].fraction).margin(1e-6));
  }
  // A share rounded to nothing stays non-negative.
  const Split tiny(
      {SplitShare{Device{"cpu", 0}, 1.0 - 1e-9}, SplitShare{Device{"reference", 0}, 1e-9}});
  CHECK(Split::parse(tiny.to_string()).shares()[1].fraction == 0.0);
}

TEST_CASE("Layer splits file reads back the fractions exactly as Split to_string wrote them") {
  TempDir dir("hybridnn-split");
  const std::string path = dir.file("splits.txt");
  const LayerSplits splits = {
      {"conv1", Split({SplitShare{Device{"cpu", 0}, 0.9712345678},
                       SplitShare{Device{"reference", 0}, 1.0 - 0.9712345678}})},
      {"pool1", Split::parse("cpu:0.5,reference:0.5")},
      {"ip.1/x", Split::parse("reference:1.0,cpu:0.0")},
      {"conv2", Split::parse("cuda:1:0.25,cpu:3:0.75")}};
  write_layer_splits(path, splits);
  for (const auto& entry : fs::directory_iterator(fs::path(path).parent_path()))
    CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
  const std::string text = contents(path);
  CHECK(text.rfind("# ", 0) == 0);
  CHECK_THAT(text, Catch::Contains("--split-file") && Catch::Contains("conv1 cpu:0.971235,"));
  const LayerSplits read = read_layer_splits(path);
  REQUIRE(read.size() == splits.size());
  for (std::size_t i = 0; i < splits.size(); ++i) {
    INFO(splits[i].first);
    CHECK(read[i].first == splits[i].first);
    CHECK(read[i].second.to_string() == splits[i].second.to_string());
    // Exactly the fractions of the written text, read independently of the file code.
    const Split written = Split::parse(splits[i].second.to_string());
    REQUIRE(read[i].second.shares().size() == written.shares().size());
    for (std::size_t k = 0; k < written.shares().size(); ++k) {
      CHECK(read[i].second.shares()[k].device == written.shares()[k].device);
      CHECK(read[i].second.shares()[k].fraction == written.shares()[k].fraction);
    }
  }
  // Rewriting replaces the file; comments, blank lines and CRLF endings are ignored.
  write_layer_splits(path, {splits[1]});
  CHECK(read_layer_splits(path).size() == 1);
  const std::string edited = dir.write(
      "edited.txt", "# measured by hand\r\n\r\n  conv1 \t cpu = 0.5, reference = 0.5\r\n");
  const LayerSplits by_hand = read_layer_splits(edited);
  REQUIRE(by_hand.size() == 1);
  CHECK(by_hand[0].first == "conv1");
  CHECK(by_hand[0].second.to_string() == "cpu:0.5,reference:0.5");
  CHECK(read_layer_splits(dir.write("empty.txt", "")).empty());
}

TEST_CASE("Layer splits file errors name the file and line and what is wrong") {
  TempDir dir("hybridnn-split");
  // A FIFO would block the reader until a writer comes: refused from its type.
  const std::string fifo = dir.write("fifo.txt", "");
  std::filesystem::remove(fifo);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(read_layer_splits(fifo), Catch::Contains(fifo) && Catch::Contains("a FIFO"));
  const std::string missing = dir.write("missing.txt", "# splits\nconv1 cpu:1.0\npool1\n");
  CHECK_THROWS_WITH(read_layer_splits(missing),
                    Catch::Contains(missing + ":3") && Catch::Contains("pool1 has no split"));
  const std::string bad = dir.write("bad.txt", "conv1 cpu:0.6,reference:0.6\n");
  CHECK_THROWS_WITH(read_layer_splits(bad), Catch::Contains(bad + ":1") &&
                                                Catch::Contains("conv1") &&
                                                Catch::Contains("sum to 1.2"));
  const std::string twice = dir.write("twice.txt", "conv1 cpu:1.0\n\nconv1 reference:1.0\n");
  CHECK_THROWS_WITH(read_layer_splits(twice), Catch::Contains(twice + ":3") &&
                                                  Catch::Contains("conv1 is named twice") &&
                                                  Catch::Contains("line 1"));
  const std::string automatic = dir.write("auto.txt", "conv1 auto:cpu,reference\n");
  CHECK_THROWS_WITH(read_layer_splits(automatic),
                    Catch::Contains(automatic + ":1") && Catch::Contains("automatic"));
  CHECK_THROWS_WITH(read_layer_splits(dir.file("absent.txt")),
                    Catch::Contains(dir.file("absent.txt")) && Catch::Contains("cannot read"));
  CHECK_THROWS_WITH(write_layer_splits(dir.file("out.txt"), {{"conv1", Split::parse("auto")}}),
                    Catch::Contains("conv1") && Catch::Contains("measured"));
  CHECK_THROWS_WITH(write_layer_splits(dir.file("out.txt"), {{"conv 1", Split::parse("cpu")}}),
                    Catch::Contains("conv 1"));
  CHECK_THROWS_WITH(write_layer_splits(dir.file("no/such/dir/out.txt"), {}),
                    Catch::Contains("no/such/dir/out.txt"));
  CHECK_FALSE(fs::exists(dir.file("out.txt")));
}

}  // namespace
}  // namespace hn
