// The coefficients of kat::math::detail::normal_tail_terms
// (include/kat/core/detail/float_math.hpp): Q(t) ≈ erfc(z)·exp(z²)/t for z = 2/t − 2 (t = 1/(1 +
// z/2), z = |x|/√2), so that Φ(−|x|) = t·exp(−x²/2)·Q(t)/2.
//
//   g++ -O2 scripts/fit_normal_tail.cpp -o /tmp/fit_normal_tail && /tmp/fit_normal_tail [degree]
//
// Chebyshev interpolation of degree d (default 9) on t in [0.15, 1] (|x| <= 16, past where
// Φ(−|x|) underflows in float) in long double, converted to monomials in t and rounded to float;
// the constant term is then moved by whole float spacings until the float evaluation gives
// Q(1) = 1 exactly (Φ(0) = 1/2). Prints the coefficients, constant first, and the largest relative
// error of t·Q(t) against erfc(z)·exp(z²), with t and Q(t) evaluated in float as the library does
// (z from a float |x|, Horner's rule with fused multiply-adds), over |x| in [0, 15.5].
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using real = long double;

real scaled_erfc_over_t(real t) {
  const real z = 2 / t - 2;
  return erfcl(z) * expl(z * z) / t;
}

float horner(const std::vector<float> &c, float t) {
  float q = c.back();
  for (std::size_t k = c.size() - 1; k-- > 0;) {
    q = std::fma(q, t, c[k]);
  }
  return q;
}

} // namespace

int main(int argc, char **argv) {
  const int degree = argc > 1 ? std::atoi(argv[1]) : 9;
  if (degree < 1 || degree > 20) {
    std::fprintf(stderr, "fit_normal_tail: degree must be in [1, 20], got %s\n", argv[1]);
    return 1;
  }
  const real t0 = 0.15L, pi = 3.141592653589793238462643383279502884L;
  const int n = degree + 1;
  // Chebyshev coefficients c_j of the interpolant at the n Chebyshev nodes u_i of [−1, 1],
  // t = t0 + (1 − t0)(u + 1)/2.
  std::vector<real> f(n), c(n, 0);
  for (int i = 0; i < n; ++i) {
    const real u = cosl(pi * (i + 0.5L) / n);
    f[i] = scaled_erfc_over_t(t0 + (1 - t0) * (u + 1) / 2);
  }
  for (int j = 0; j < n; ++j) {
    real s = 0;
    for (int i = 0; i < n; ++i) {
      s += f[i] * cosl(pi * j * (i + 0.5L) / n);
    }
    c[j] = 2 * s / n;
  }
  c[0] /= 2;
  // Monomials in u (T_j by the recurrence), then in t (u = alpha t + beta).
  std::vector<std::vector<real>> T(n, std::vector<real>(n, 0));
  T[0][0] = 1;
  if (n > 1) {
    T[1][1] = 1;
  }
  for (int j = 2; j < n; ++j) {
    for (int k = 0; k < n; ++k) {
      T[j][k] = -T[j - 2][k] + (k > 0 ? 2 * T[j - 1][k - 1] : 0);
    }
  }
  std::vector<real> in_u(n, 0), in_t(n, 0);
  for (int j = 0; j < n; ++j) {
    for (int k = 0; k < n; ++k) {
      in_u[k] += c[j] * T[j][k];
    }
  }
  const real alpha = 2 / (1 - t0), beta = -(1 + t0) / (1 - t0);
  for (int k = 0; k < n; ++k) {
    real binomial = 1; // k choose m
    for (int m = 0; m <= k; ++m) {
      in_t[m] += in_u[k] * binomial * powl(alpha, m) * powl(beta, k - m);
      binomial = binomial * (k - m) / (m + 1);
    }
  }
  std::vector<float> q(n);
  for (int k = 0; k < n; ++k) {
    q[k] = static_cast<float>(in_t[k]);
  }
  int moved = 0;
  while (horner(q, 1.0f) != 1.0f && moved < 64) {
    q[0] = std::nextafter(q[0], horner(q, 1.0f) < 1.0f ? 1.0f : 0.0f);
    ++moved;
  }
  double worst = 0, worst_x = 0;
  for (double x = 0; x <= 15.5; x += 1e-4) {
    const float ax = static_cast<float>(x);
    const float z = ax * 0.70710678118654752f;
    const float t = 1.0f / (1.0f + 0.5f * z);
    const real exact_z = static_cast<real>(ax) / sqrtl(2.0L);
    const real exact = erfcl(exact_z) * expl(exact_z * exact_z);
    const double e =
        static_cast<double>(fabsl((static_cast<real>(t) * horner(q, t) - exact) / exact));
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  }
  std::printf("degree %d on t in [0.15, 1]; constant moved by %d float spacings for Q(1) = 1\n",
              degree, moved);
  for (int k = 0; k < n; ++k) {
    std::printf("  q%d = %.9ef\n", k, static_cast<double>(q[k]));
  }
  std::printf("largest relative error of t Q(t) against erfc(z) exp(z^2): %.3g at |x| = %.4f\n",
              worst, worst_x);
  return 0;
}
