/*
 * metal_mock.h — just enough of <metal_stdlib> for a C++ compiler to
 * syntax- and type-check the Metal amalgamation (tests/test_gpu_emul.py):
 * address-space words vanish, [[attributes]] are ignored, Metal's functions
 * are declared with their MSL signatures. Not a Metal compiler: it cannot
 * check MSL's own rules (docs/gpu.md lists what stays untested).
 */
#include <cmath>
#include <cstdint>
#include <cstring>
typedef uint32_t uint;
typedef uint16_t ushort;
typedef uint8_t uchar;
struct uint3 { uint x, y, z; };
struct uint4 { uint x, y, z, w; };
struct uint2 { uint x, y; };
struct char4 { int8_t x, y, z, w; };
struct half { ushort bits; half() = default; explicit half(float); operator float() const; };
#define kernel
#define device
#define threadgroup
#define constant
namespace metal {
namespace precise { float exp(float); float log(float); float sqrt(float); }
using std::fabs;
using std::fma;
using std::rint;
template <class T, class U> T as_type(U u) { static_assert(sizeof(T) == sizeof(U), "as_type size"); T t; std::memcpy(&t, &u, sizeof t); return t; }
float simd_shuffle_xor(float, ushort);
int simd_shuffle_xor(int, ushort);
int simd_shuffle(int, ushort);
enum class mem_flags { mem_none, mem_threadgroup, mem_device };
void threadgroup_barrier(mem_flags);
struct atomic_uint { uint v; };
enum memory_order { memory_order_relaxed };
uint atomic_fetch_or_explicit(device atomic_uint *, uint, memory_order);
}
using namespace metal;
