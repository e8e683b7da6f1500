// The generated protocol code (replica.proto), compiled as one translation unit.
#include "router/replica.pb.cc"
#include "router/replica.grpc.pb.cc"
