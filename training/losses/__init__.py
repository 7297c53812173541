"""One module per distillation method; each keeps its tensor maths in a pure function."""
