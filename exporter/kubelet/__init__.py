"""The kubelet's pod-resources API v1: the proto as published (``api.proto``) and the modules grpcio-tools
generates from it (``api_pb2``, ``api_pb2_grpc``; ``python tools/gen_podresources.py`` regenerates them)."""
