//! `dlpack-core`: everything about DLPack memory that needs no Python. The extension
//! (`dlpack-adapter`, the package at the repository root) builds its one tensor description from
//! these parts, and its importers, exporters and Python type on top.
//!
//! The data path, as the extension runs it: a producer's memory is described by an element type
//! (`dtype`: DLPack's `DLDataType`, parsed from PEP 3118 formats and array-interface typestrs),
//! a layout (`layout`: shape and strides, checked, in bytes and in elements, with the overlap
//! math), and a device (`device`, on `abi`'s `DLDevice`); exports write `abi`'s structs. What
//! can't be served in place is copied: `copy` plans strided copies and runs them on the CPU
//! (`copy::cpu`) or as transfers (`copy::device`, driven by `copy::driver` through `cuda`), into
//! memory we own (`memory`).
//!
//! ```text
//! abi        DLPack's C ABI (dlpack.h 1.3): tensors, managed tensors, versions, flags, device
//!            and type codes, the C exchange API table
//! device     device type names (DEVICE_TYPES), host and CPU-readable memory, DLDevice's names
//! dtype      DType, StoredType (type and byte order), TypeStr; buffer formats and typestrs
//! layout     strided (Layout: shape, byte and element strides, checked), derived (dense and
//!            broadcast strides, byte extents), overlap (whether elements share bytes)
//! available  memory this process can still have (MemAvailable, cgroup limits): MemoryError
//!            before a large allocation the machine can't back
//! memory     AlignedBuffer (host, huge pages when large), DeviceBuffer (CUDA)
//! cuda       the CUDA driver, opened at run time: pointer attributes, contexts, streams, events
//! copy       plan (loops of a strided copy), cpu (the strided engine and its kernels), device
//!            (transfers planned over a Mover: view, rows, mover, engine), driver (the CUDA
//!            driver as a Mover)
//! share      what sharing host memory between processes asks of Linux: sealed memory files,
//!            whole-file locks, mappings, Unix sockets passing descriptors, ids
//! error      Error: a kind (BufferError, TypeError, ValueError, RuntimeError, MemoryError in
//!            Python) and a message
//! ```

pub mod abi;
#[cfg(feature = "runtime")]
pub mod available;
#[cfg(feature = "runtime")]
pub mod copy;
#[cfg(feature = "runtime")]
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod layout;
#[cfg(feature = "runtime")]
pub mod memory;
#[cfg(all(feature = "runtime", target_os = "linux"))]
pub mod share;
