#include "lambda.hpp"
float use_b() { return Step<float>::run(2.f); }
