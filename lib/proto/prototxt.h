// Internal readers for Caffe-format files: text .prototxt nets and solvers, and binary
// messages (.caffemodel, .solverstate, .binaryproto). Errors are hn::Error naming the file.
#pragma once

#include <string>

#include <vector>

#include "hybridnn.pb.h"
#include "lib/core/device.h"
#include "lib/core/tensor.h"

namespace hn::detail {

// Parses a text-format NetParameter; errors read "FILE:LINE:COLUMN: message" (1-based).
hybridnn::proto::NetParameter read_net_prototxt(const std::string& path);

// The same from text in memory; `origin` takes the file's place in errors.
hybridnn::proto::NetParameter parse_net_prototxt(const std::string& text,
                                                 const std::string& origin);

// The devices the net's `split` entries name (the net's, then its layers'), each once, in
// order of appearance; entries that name no device are left to building the net to report.
std::vector<Device> split_devices(const hybridnn::proto::NetParameter& net);

// Parses a text-format SolverParameter; errors as for read_net_prototxt.
hybridnn::proto::SolverParameter read_solver_prototxt(const std::string& path);

// Parses any text-format message into `message`, replacing its contents.
void read_text_proto(const std::string& path, google::protobuf::Message& message);

// Parses text-format `text` into `message`; errors name `origin` as for a file.
void parse_text_proto(const std::string& text, const std::string& origin,
                      google::protobuf::Message& message);

// Parses a binary message into `message`, replacing its contents; a truncated or foreign
// file is an error that names the path and the expected message type.
void read_binary_proto(const std::string& path, google::protobuf::Message& message);

// A BlobShape as a Shape.
Shape shape_of(const hybridnn::proto::BlobShape& shape);
// A BlobProto's shape: `shape` when present, else the legacy num/channels/height/width.
Shape blob_shape(const hybridnn::proto::BlobProto& blob);
// Caffe's Blob::ShapeEquals: a legacy 4-d shape matches ours padded with ones on the left.
bool blob_shape_matches(const hybridnn::proto::BlobProto& blob, const Shape& shape);

// Serialises `message` in binary to `path`, replacing the file.
void write_binary_proto(const std::string& path, const google::protobuf::Message& message);

}  // namespace hn::detail
