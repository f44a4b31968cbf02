// Host-side 16-bit float conversions, so the CPU kernels need neither libtorch nor compiler extensions.
#pragma once

#include <cstdint>
#include <cstring>

namespace pp {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};

inline float to_float(float x) { return x; }
inline double to_double(double x) { return x; }
inline float to_float(double x) { return static_cast<float>(x); }
inline float to_float(BFloat16 x) { return bits_float(static_cast<uint32_t>(x.bits) << 16); }

inline float to_float(Float16 x) {
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  uint32_t exponent = (x.bits >> 10) & 0x1fu;
  uint32_t mantissa = x.bits & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf / nan
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal half: normalise the mantissa into a float exponent.
    exponent = 127 - 15 + 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
    return bits_float(sign | (exponent << 23) | (mantissa << 13));
  }
  return bits_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

// Round to nearest, ties to even, as torch's .to(torch.bfloat16) does.
inline BFloat16 to_bfloat16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet nan
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((u + rounding) >> 16)};
}

// Round to nearest, ties to even; overflow to inf, underflow through the subnormal range.
inline Float16 to_float16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Float16{static_cast<uint16_t>(sign | 0x7e00u)};  // nan
  if (abs >= 0x477ff000u) return Float16{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value = mantissa * 2^-24.
    if (abs < 0x33000000u) return Float16{sign};  // below half of the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24 for this range
    const uint32_t half_mantissa = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t result = half_mantissa;
    if (remainder > halfway || (remainder == halfway && (half_mantissa & 1u))) ++result;
    return Float16{static_cast<uint16_t>(sign | result)};
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits.
  const uint32_t rebased = abs - ((127u - 15u) << 23);
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return Float16{static_cast<uint16_t>(sign | ((rebased + rounding) >> 13))};
}

template <typename T>
inline T from_float(float x);
template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline BFloat16 from_float<BFloat16>(float x) {
  return to_bfloat16(x);
}
template <>
inline Float16 from_float<Float16>(float x) {
  return to_float16(x);
}

}  // namespace pp
