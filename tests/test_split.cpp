// Split specs: the grammar, validation with clear errors, and the rounding of fractions to
// rows against the exact shares.
#include <catch2/catch.hpp>

#include <cmath>

#include "hybridnn/error.h"
#include "hybridnn/runtime.h"
#include "hybridnn/split.h"

namespace hn {
namespace {

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

TEST_CASE("Split check_devices names a device without a driver and those present") {
  Runtime runtime;
  runtime.add(Device::parse("reference"));
  Split::parse("reference").check_devices(runtime);
  CHECK_THROWS_WITH(Split::parse("reference:0.5,cuda:3:0.5").check_devices(runtime),
                    Catch::Contains("cuda:3") && Catch::Contains("present: reference"));
}

}  // namespace
}  // namespace hn
