//! The names of the capsules the Python DLPack protocol passes around.

use std::ffi::CStr;

/// Capsule names of the Python DLPack protocol; consumers rename a capsule to the `used_` form
/// when they take ownership of its tensor.
pub const CAPSULE_LEGACY: &CStr = c"dltensor";
pub const CAPSULE_VERSIONED: &CStr = c"dltensor_versioned";
pub const CAPSULE_LEGACY_USED: &CStr = c"used_dltensor";
pub const CAPSULE_VERSIONED_USED: &CStr = c"used_dltensor_versioned";

/// Capsule name of the DLPack C exchange API table (`__dlpack_c_exchange_api__`).
pub const CAPSULE_EXCHANGE_API: &CStr = c"dlpack_exchange_api";
