"""ONNX export of a student (pooling, projection and normalisation in the graph) and its runtime."""
