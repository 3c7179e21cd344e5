// Caffe's phases: a net and its data feeds run for training or for testing.
#pragma once

namespace hn {

enum class Phase { train, test };

}  // namespace hn
