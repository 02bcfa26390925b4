//! The CUDA driver, opened at run time through cudarc: nothing CUDA is linked at build time, and
//! a machine without a driver (or without a GPU) gets a clear error message instead of a crash.

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::abi::{DLDevice, device_type};

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

/// A driver call's status as a `Result`, naming the call.
pub fn check(status: sys::CUresult, what: &str) -> Result<(), String> {
    if status == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed ({status:?})"))
    }
}

/// The primary context of a device: retained once per process and never released, so any
/// thread (a deleter's, too) can make it current. Only `primary_context` makes one.
#[derive(Clone, Copy)]
pub struct Context(sys::CUcontext);
// SAFETY: a CUDA context handle may be used from any thread.
unsafe impl Send for Context {}
// SAFETY: a shared `Context` only gives out copies of its handle, and a CUDA context handle
// may be used from any thread.
unsafe impl Sync for Context {}

impl Context {
    /// The driver's handle, live for the rest of the process.
    pub fn handle(self) -> sys::CUcontext {
        self.0
    }
}

pub fn primary_context(device_id: i32) -> Result<Context, String> {
    driver()?;
    static CONTEXTS: std::sync::Mutex<Vec<(i32, Context)>> = std::sync::Mutex::new(Vec::new());
    let mut contexts = CONTEXTS
        .lock()
        .map_err(|_| "CUDA context table poisoned".to_owned())?;
    if let Some(&(_, ctx)) = contexts.iter().find(|(id, _)| *id == device_id) {
        return Ok(ctx);
    }
    let mut device: sys::CUdevice = 0;
    // SAFETY: the out-parameter is a live local; the driver validates the ordinal.
    let found = unsafe { sys::cuDeviceGet(&mut device, device_id) };
    check(found, "cuDeviceGet")?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the out-parameter is a live local; `device` is a device the driver named.
    let retained = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) };
    check(retained, "cuDevicePrimaryCtxRetain")?;
    contexts.push((device_id, Context(ctx)));
    Ok(Context(ctx))
}

/// Run `body` with `ctx` current on this thread, restoring the previous context after.
pub fn with_context<T>(
    ctx: Context,
    body: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    // SAFETY: `ctx` is a retained primary context; push and pop are paired on this thread.
    unsafe { check(sys::cuCtxPushCurrent_v2(ctx.0), "cuCtxPushCurrent")? };
    let result = body();
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    result
}

/// The stream handle the array API's `stream` integer names (None: the legacy default stream).
pub fn stream_handle(stream: Option<i64>) -> sys::CUstream {
    stream.unwrap_or(1) as isize as sys::CUstream
}

/// Make `consumer` wait, on the device, for the work queued on `producer` so far: an event
/// recorded on one and waited for by the other, so the host never blocks.
///
/// # Safety
/// `producer` and `consumer` (when given) are handles of live CUDA streams of device
/// `device_id` (or 1 or 2, the default streams).
pub unsafe fn stream_wait(
    device_id: i32,
    producer: isize,
    consumer: Option<i64>,
) -> Result<(), String> {
    let ctx = primary_context(device_id)?;
    // The event is created, recorded, waited on and released here (the driver defers its
    // destruction until it completes), with the device's context current.
    with_context(ctx, || {
        let mut event: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the out-parameter is a live local.
        let created = unsafe { sys::cuEventCreate(&mut event, flags) };
        check(created, "cuEventCreate")?;
        // SAFETY: a live event; `producer` is a live stream per the contract.
        let recorded = unsafe { sys::cuEventRecord(event, producer as sys::CUstream) };
        let waited = check(recorded, "cuEventRecord").and_then(|()| {
            // SAFETY: a live, recorded event; `consumer` is a live stream per the contract.
            let waited = unsafe { sys::cuStreamWaitEvent(stream_handle(consumer), event, 0) };
            check(waited, "cuStreamWaitEvent")
        });
        // SAFETY: the event was created above and is destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(event) };
        waited
    })
}
