// The generated protocol code (shard.proto), compiled as one translation unit.
#include "shard/shard.pb.cc"
#include "shard/shard.grpc.pb.cc"
