#include "lambda.hpp"
float use_a() { return Step<float>::run(1.f); }
