//! Where memory is: a place (the host or a device), an address in it, and strided views.

use crate::copy::cpu::{Strided, byte_span};

/// Where memory lives: host memory (pageable or pinned) or a device's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Host,
    Device(i32),
}

/// An address and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    pub at: usize,
    pub place: Place,
}

impl Addr {
    pub(super) fn offset(self, bytes: isize) -> Addr {
        Addr {
            at: self.at.wrapping_add_signed(bytes),
            place: self.place,
        }
    }
}

/// A strided array of elements: element `i` starts `sum(i_k * strides[k])` bytes from `base`.
#[derive(Clone, Debug)]
pub struct View {
    pub base: Addr,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
}

impl View {
    /// C-ordered strides for `shape`.
    pub fn c_order(base: Addr, shape: &[usize], itemsize: usize) -> View {
        let mut strides = vec![0isize; shape.len()];
        let mut step = itemsize as isize;
        for (stride, &n) in strides.iter_mut().zip(shape).rev() {
            *stride = step;
            step = step.wrapping_mul(n.max(1) as isize);
        }
        View {
            base,
            shape: shape.to_vec(),
            strides,
        }
    }

    /// The bytes the view touches, relative to `base`: `[low, high)` (empty without elements).
    pub(super) fn span(&self, itemsize: usize) -> (isize, isize) {
        let base = self.base.at as i128;
        byte_span(&self.as_strided(), itemsize).map_or((0, 0), |(low, high)| {
            ((low - base) as isize, (high - base) as isize)
        })
    }

    pub(super) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The same description for the CPU engine's functions (addresses only: nothing is read).
    pub fn as_strided(&self) -> Strided {
        Strided {
            ptr: self.base.at as *mut u8,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
        }
    }
}
