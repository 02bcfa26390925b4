//! Copies in which device memory takes part, planned as DMA transfers.
//!
//! A copy is cut into rows that are contiguous on both sides ([`rows`]); rows go to the driver as
//! one linear, 2-D or 3-D pitched memcpy per block, and the loops a pitched copy can't express
//! run from the host. Layouts that would take too many small transfers (a transpose, a gather)
//! are staged through host memory, where the CPU engine reorders them, and sent as whole spans.
//! Copies between two devices go through a dense buffer on each side.
//!
//! The planning and staging (`engine`) are generic over [`Mover`] (`mover`), the few operations
//! they need from a driver: `super::driver` implements it with the CUDA driver, and the tests'
//! `emulator` with host memory that plays the devices (transfers queued until a sync, pitched
//! copies refused the way a driver may), so every path is checked without a GPU. `view` says
//! where memory is, `rows` cuts a planned copy into transfers.

#[cfg(test)]
mod emulator;
mod engine;
mod mover;
mod rows;
mod view;

pub use engine::copy_views;
pub use mover::{MAX_PITCH, Mover, Pitched, TUNING, Tuning};
pub use rows::{Rows, rows};
pub use view::{Addr, Place, View};
