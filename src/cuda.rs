//! The CUDA driver, opened at run time through cudarc: nothing CUDA is linked at build time, and
//! a machine without a driver (or without a GPU) gets a clear error message instead of a crash.

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::ffi::{DLDevice, device_type};

/// Load the driver library and run `cuInit` once per process; the error says why CUDA is not
/// usable here.
fn driver() -> Result<(), String> {
    static STATE: OnceLock<Result<(), String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // cudarc panics when a library or symbol is missing; keep that from unwinding into
            // Python.
            std::panic::catch_unwind(|| {
                // SAFETY: only probes whether libcuda can be opened.
                if !unsafe { sys::is_culib_present() } {
                    return Err("the CUDA driver library (libcuda) is not installed".to_owned());
                }
                // SAFETY: cuInit has no preconditions; it is called once here.
                let status = unsafe { sys::cuInit(0) };
                if status != sys::CUresult::CUDA_SUCCESS {
                    return Err(format!("the CUDA driver failed to initialise ({status:?})"));
                }
                Ok(())
            })
            .unwrap_or_else(|_| Err("the CUDA driver could not be loaded".to_owned()))
        })
        .clone()
}

/// The DLPack device of a CUDA pointer (device, managed or pinned host memory), from the
/// driver's pointer attributes.
pub fn pointer_device(ptr: *mut c_void) -> Result<DLDevice, String> {
    driver().map_err(|e| format!("can't tell the device of CUDA memory: {e}"))?;
    let address = ptr as sys::CUdeviceptr;
    let mut memory_type: u32 = 0;
    let mut is_managed: u32 = 0;
    let mut ordinal: i32 = 0;
    let query = |attribute, out: *mut c_void| {
        // SAFETY: `out` points to a live local of the size the attribute writes (an unsigned int
        // or an int); the driver is initialised.
        let status = unsafe { sys::cuPointerGetAttribute(out, attribute, address) };
        if status == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!(
                "the CUDA driver does not know the pointer {ptr:?} ({status:?})"
            ))
        }
    };
    use sys::CUpointer_attribute as A;
    query(
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        (&raw mut memory_type).cast(),
    )?;
    query(
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        (&raw mut is_managed).cast(),
    )?;
    query(
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        (&raw mut ordinal).cast(),
    )?;
    let host = sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32;
    Ok(if is_managed != 0 {
        DLDevice {
            device_type: device_type::CUDA_MANAGED,
            device_id: 0,
        }
    } else if memory_type == host {
        DLDevice {
            device_type: device_type::CUDA_HOST,
            device_id: 0,
        }
    } else {
        DLDevice {
            device_type: device_type::CUDA,
            device_id: ordinal,
        }
    })
}

/// The device of the calling thread's current CUDA context (for memory without an address,
/// such as a zero-size array with a null pointer).
pub fn current_device() -> Result<DLDevice, String> {
    driver().map_err(|e| format!("can't tell the device of CUDA memory: {e}"))?;
    let mut ordinal: sys::CUdevice = 0;
    // SAFETY: `ordinal` is a live local the driver writes one CUdevice into.
    let status = unsafe { sys::cuCtxGetDevice(&mut ordinal) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!(
            "no current CUDA context to place a null CUDA pointer ({status:?})"
        ));
    }
    Ok(DLDevice {
        device_type: device_type::CUDA,
        device_id: ordinal,
    })
}

/// Block until all work queued on `stream` (a CUDA stream handle; 1 and 2 are the legacy and
/// per-thread default streams) has finished.
pub fn synchronize_stream(stream: isize) -> Result<(), String> {
    driver()?;
    // SAFETY: the caller got `stream` from a producer that declared its data ready on it; the
    // driver validates the handle and reports an error for a bad one.
    let status = unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!(
            "waiting for the producer's CUDA stream {stream:#x} failed ({status:?})"
        ));
    }
    Ok(())
}
