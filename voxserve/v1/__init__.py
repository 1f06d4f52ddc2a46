"""Generated gRPC code for proto/voxserve/v1/voxserve.proto (the package name matches the
proto package, so the generated imports resolve as they are). Do not edit these modules:
change the proto and run scripts/gen_proto.sh. They need the `grpc` extra."""
