#include <cstdio>
float use_a();
float use_b();
int main() {
  std::printf("b: %g\n", use_b());
  std::printf("a: %g\n", use_a());
}
