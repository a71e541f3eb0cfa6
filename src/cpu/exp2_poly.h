// The one definition of the vector exp2 rule that the NEON, AVX2 and AVX-512 tile kernels
// evaluate (kernels_neon.cpp, avx2_math.h, avx512_math.h; tests/cpu/test_kernels.cpp
// Exp2IsTheRule checks each against it): 2^x = 2^n * 2^f with n = round(x), f = x - n in
// [-0.5, 0.5], 2^f from its Taylor polynomial p(f) = sum_k (ln 2)^k / k! f^k of a chosen degree
// (at most kExp2MaxDegree), for x <= 0 or NaN; inputs below kExp2Lowest are raised to it (2^-150
// rounds to 0 in fp32); NaN stays NaN. Plain constants, so any target may include it.
#pragma once

namespace flashattn {
namespace cpu {

constexpr int kExp2MaxDegree = 7;
constexpr float kExp2Lowest = -150.0f;
// (ln 2)^k / k!, k = 0 .. kExp2MaxDegree.
constexpr float kExp2Coefficients[kExp2MaxDegree + 1] = {1.0f,
                                                         0.6931471805599453f,
                                                         0.2402265069591007f,
                                                         0.05550410866482158f,
                                                         0.009618129107628477f,
                                                         0.0013333558146428443f,
                                                         0.00015403530393381608f,
                                                         1.525273380405984e-05f};

}  // namespace cpu
}  // namespace flashattn
