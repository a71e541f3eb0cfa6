// Kernel names and the kernel override from the environment: the one place the library reads an
// environment variable (FLASHATTN_KERNEL).
#include <cstdlib>
#include <sstream>
#include <string>

#include "api/kernel_choice.h"
#include "flashattn/flashattn.h"

namespace flashattn {

namespace {

constexpr const char* kEnvName = "FLASHATTN_KERNEL";

struct Named {
  const char* name;
  Kernel kernel;
};
constexpr Named kKernels[] = {
    {"automatic", Kernel::automatic}, {"cpu", Kernel::cpu},     {"mma", Kernel::mma},
    {"wgmma", Kernel::wgmma},         {"warpspec", Kernel::warpspec},   {"splitkeys", Kernel::splitkeys},
    {"deep", Kernel::deep},
    {"dims", Kernel::dims},           {"persistent", Kernel::persistent}, {"heads", Kernel::heads},
};

[[noreturn]] void bad_value(const std::string& value, const std::string& why) {
  throw Error(Error::Kind::invalid_argument, std::string(kEnvName) + "=" + value + ": " + why +
                                                 " (expected <kernel>[,tile=wide|narrow|narrow96]"
                                                 "[,order=per_unit|heavy_first][,grid=persistent|tiles|<n>][,combine=kernel][,pdl=off][,stage=cpu][,cpu=portable|neon|avx2|avx512|avx512bf16|amx]"
                                                 "[,checked=on|off],"
                                                 " kernel one of automatic, mma, wgmma, warpspec, splitkeys, deep, dims,"
                                                 " persistent, heads)");
}

// A count of 1 to 2^31 - 1 written in decimal digits.
bool is_positive_count(const std::string& s) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  const long long n = std::stoll(s);
  return n >= 1 && n <= 2147483647LL;
}

// One "key=value" (or the leading kernel name) into o.
void apply_field(const std::string& field, bool first, const std::string& whole, KernelOverride& o) {
  const size_t eq = field.find('=');
  if (first && eq == std::string::npos) {
    for (const Named& k : kKernels) {
      if (field == k.name && k.kernel != Kernel::cpu) {
        o.kernel = k.kernel;
        return;
      }
    }
    bad_value(whole, "unknown kernel '" + field + "'");
  }
  const std::string key = field.substr(0, eq);
  const std::string value = eq == std::string::npos ? "" : field.substr(eq + 1);
  if (key == "tile" && value == "wide") {
    o.wgmma_tile = WgmmaTile::wide;
  } else if (key == "tile" && value == "narrow") {
    o.wgmma_tile = WgmmaTile::narrow;
  } else if (key == "tile" && value == "narrow96") {
    o.wgmma_tile = WgmmaTile::narrow96;
  } else if (key == "order" && value == "per_unit") {
    o.tile_order = TileOrder::per_unit;
  } else if (key == "order" && value == "heavy_first") {
    o.tile_order = TileOrder::heavy_first;
  } else if (key == "grid" && value == "tiles") {
    o.prefill_ctas = -1;
  } else if (key == "grid" && value == "persistent") {
    o.prefill_ctas = 0;
  } else if (key == "grid" && is_positive_count(value)) {
    o.prefill_ctas = std::stoi(value);
  } else if (key == "combine" && value == "kernel") {
    o.cluster_combine = false;
  } else if (key == "pdl" && value == "off") {
    o.programmatic_launch = false;
  } else if (key == "stage" && value == "cpu") {
    o.stage_on_cpu = true;
  } else if (key == "cpu" && value == "portable") {
    o.cpu_kernels = CpuKernels::portable;
  } else if (key == "cpu" && value == "neon") {
    o.cpu_kernels = CpuKernels::neon;
  } else if (key == "cpu" && value == "avx2") {
    o.cpu_kernels = CpuKernels::avx2;
  } else if (key == "cpu" && value == "avx512") {
    o.cpu_kernels = CpuKernels::avx512;
  } else if (key == "cpu" && value == "avx512bf16") {
    o.cpu_kernels = CpuKernels::avx512bf16;
  } else if (key == "cpu" && value == "amx") {
    o.cpu_kernels = CpuKernels::amx;
  } else if (key == "checked" && value == "on") {
    o.checked = true;
  } else if (key == "checked" && value == "off") {
    o.checked = false;
  } else {
    bad_value(whole, "unknown setting '" + field + "'");
  }
}

}  // namespace

KernelOverride parse_kernel_override(const std::string& value) {
  KernelOverride o;
  std::stringstream fields(value);
  std::string field;
  bool first = true;
  while (std::getline(fields, field, ',')) {
    if (!field.empty()) apply_field(field, first, value, o);
    first = false;
  }
  return o;
}

const char* kernel_name(Kernel kernel) {
  for (const Named& k : kKernels) {
    if (k.kernel == kernel) return k.name;
  }
  return "unknown";
}

const KernelOverride& kernel_override_from_env() {
  static const KernelOverride parsed = [] {
    const char* value = std::getenv(kEnvName);
    return value == nullptr ? KernelOverride{} : parse_kernel_override(value);
  }();
  return parsed;
}

}  // namespace flashattn
