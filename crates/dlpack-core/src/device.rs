//! Devices: what each `DLDeviceType` code is called, and which memory the CPU reaches directly.

use crate::abi::{DLDevice, device_type};

/// Every code with its `dlpack.h` name, in `dlpack.h`'s order (Python's `DLDeviceType`).
pub const DEVICE_TYPES: &[(&str, i32)] = &[
    ("kDLCPU", device_type::CPU),
    ("kDLCUDA", device_type::CUDA),
    ("kDLCUDAHost", device_type::CUDA_HOST),
    ("kDLOpenCL", device_type::OPENCL),
    ("kDLVulkan", device_type::VULKAN),
    ("kDLMetal", device_type::METAL),
    ("kDLVPI", device_type::VPI),
    ("kDLROCM", device_type::ROCM),
    ("kDLROCMHost", device_type::ROCM_HOST),
    ("kDLExtDev", device_type::EXT_DEV),
    ("kDLCUDAManaged", device_type::CUDA_MANAGED),
    ("kDLOneAPI", device_type::ONE_API),
    ("kDLWebGPU", device_type::WEB_GPU),
    ("kDLHexagon", device_type::HEXAGON),
    ("kDLMAIA", device_type::MAIA),
    ("kDLTrn", device_type::TRN),
];

/// Host memory: the CPU addresses it directly, with no stream to order with.
pub const HOST_DEVICE_TYPES: &[i32] = &[
    device_type::CPU,
    device_type::CUDA_HOST,
    device_type::ROCM_HOST,
];

/// Memory the CPU can read in place: host memory, and CUDA managed memory once its stream is
/// done.
pub const CPU_READABLE_DEVICE_TYPES: &[i32] = &[
    device_type::CPU,
    device_type::CUDA_HOST,
    device_type::ROCM_HOST,
    device_type::CUDA_MANAGED,
];

impl DLDevice {
    pub const CPU: DLDevice = DLDevice {
        device_type: device_type::CPU,
        device_id: 0,
    };

    /// A short name: "cpu:0", "cuda:1", or the type's number for codes we don't name.
    pub fn name(self) -> String {
        let kind = match self.device_type {
            device_type::CPU => "cpu",
            device_type::CUDA => "cuda",
            device_type::CUDA_HOST => "cuda_host",
            device_type::CUDA_MANAGED => "cuda_managed",
            device_type::ROCM => "rocm",
            device_type::ROCM_HOST => "rocm_host",
            device_type::OPENCL => "opencl",
            device_type::VULKAN => "vulkan",
            device_type::METAL => "metal",
            device_type::VPI => "vpi",
            device_type::EXT_DEV => "ext_dev",
            device_type::ONE_API => "oneapi",
            device_type::WEB_GPU => "webgpu",
            device_type::HEXAGON => "hexagon",
            device_type::MAIA => "maia",
            device_type::TRN => "trn",
            _ => return format!("device_type_{}:{}", self.device_type, self.device_id),
        };
        format!("{kind}:{}", self.device_id)
    }

    /// Whether the CPU can address this memory directly (no stream to synchronise with): the
    /// CPU's, and CUDA's or ROCm's pinned host memory.
    #[inline]
    pub fn is_host(self) -> bool {
        HOST_DEVICE_TYPES.contains(&self.device_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_cpu_readable() {
        for code in HOST_DEVICE_TYPES {
            assert!(CPU_READABLE_DEVICE_TYPES.contains(code));
        }
        let named = |code| DEVICE_TYPES.iter().any(|&(_, c)| c == code);
        assert!(CPU_READABLE_DEVICE_TYPES.iter().all(|&code| named(code)));
        let device = |device_type| DLDevice {
            device_type,
            device_id: 1,
        };
        assert!(device(device_type::CUDA_HOST).is_host());
        assert!(!device(device_type::CUDA_MANAGED).is_host());
        assert_eq!(device(device_type::CUDA).name(), "cuda:1");
        assert_eq!(device(99).name(), "device_type_99:1");
    }
}
