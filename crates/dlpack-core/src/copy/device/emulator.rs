//! Host memory playing devices, for the engine's tests: a `Mover` whose transfers are checked
//! and run as a driver would run them, and the buffers the tests copy between.

use std::cell::Cell;
use std::rc::Rc;

use super::mover::{MAX_PITCH, Mover, Pitched, Tuning};
use super::view::{Addr, Place, View};
use crate::error::Result;
use crate::memory::AlignedBuffer;

/// Host memory playing devices. Transfers queue until `sync`, one queue per device (a
/// stream each), and the queues run last device first, so work on two devices that the
/// engine didn't order shows up as wrong bytes. The CPU engine runs at once. Pitched copies
/// check the driver's rules and may be refused between one device's buffers, as
/// `cuMemcpy2D` may refuse pitches it didn't allocate. Scratch stays allocated until the
/// emulator goes, so a transfer that outlives its scratch fails an assertion, not memory.
pub struct Emulator {
    pub queues: std::collections::BTreeMap<i32, Vec<(Addr, Addr, usize)>>,
    pub scratch: Vec<(AlignedBuffer, usize, Rc<Cell<bool>>)>,
    /// The test's own buffers, `(start, len)`.
    pub buffers: Vec<(usize, usize)>,
    pub refuse_pitched: bool,
    pub tuning: Tuning,
    pub pitched_calls: usize,
    pub linear_calls: usize,
}

/// Scratch handed out by the emulator: dropping it marks the memory freed.
pub struct Freed(Rc<Cell<bool>>);

impl Drop for Freed {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

impl Emulator {
    /// The device whose stream runs a transfer: the destination's, else the source's.
    fn enqueue(&mut self, dst: Addr, src: Addr, bytes: usize) {
        let device = match (dst.place, src.place) {
            (Place::Device(d), _) | (Place::Host, Place::Device(d)) => d,
            (Place::Host, Place::Host) => panic!("a host-to-host transfer"),
        };
        self.queues
            .entry(device)
            .or_default()
            .push((dst, src, bytes));
    }

    /// The range lies in the test's buffers or in live scratch.
    fn check(&self, at: usize, bytes: usize) {
        let inside = |start: usize, len: usize| start <= at && at + bytes <= start + len;
        for (buffer, len, alive) in &self.scratch {
            if inside(buffer.as_ptr() as usize, *len) {
                assert!(alive.get(), "a transfer touches scratch that was freed");
                return;
            }
        }
        assert!(
            self.buffers.iter().any(|&(start, len)| inside(start, len)),
            "a transfer outside every buffer"
        );
    }
}

impl Mover for Emulator {
    type Scratch = Freed;

    unsafe fn linear(&mut self, dst: Addr, src: Addr, bytes: usize) -> Result<()> {
        self.linear_calls += 1;
        self.enqueue(dst, src, bytes);
        Ok(())
    }

    unsafe fn pitched(&mut self, b: &Pitched) -> Result<bool> {
        assert!(
            !matches!((b.dst.place, b.src.place), (Place::Device(x), Place::Device(y)) if x != y),
            "a pitched transfer between two devices"
        );
        assert!(b.width <= b.dst_pitch && b.width <= b.src_pitch);
        assert!(b.dst_pitch <= MAX_PITCH && b.src_pitch <= MAX_PITCH);
        assert!(b.dst_rows >= b.height && b.src_rows >= b.height);
        if self.refuse_pitched && b.dst.place != Place::Host && b.src.place != Place::Host {
            return Ok(false);
        }
        self.pitched_calls += 1;
        for z in 0..b.depth {
            for y in 0..b.height {
                let d = b.dst.at + (z * b.dst_rows + y) * b.dst_pitch;
                let s = b.src.at + (z * b.src_rows + y) * b.src_pitch;
                self.enqueue(Addr { at: d, ..b.dst }, Addr { at: s, ..b.src }, b.width);
            }
        }
        Ok(true)
    }

    fn scratch(&mut self, place: Place, bytes: usize) -> Result<(Addr, Freed)> {
        let buffer = AlignedBuffer::new(bytes)?;
        let at = buffer.as_ptr() as usize;
        // Poison it, so reading what wasn't written shows.
        // SAFETY: the buffer holds `bytes` bytes.
        unsafe { std::ptr::write_bytes(buffer.as_ptr(), 0xEE, bytes) };
        let alive = Rc::new(Cell::new(true));
        self.scratch.push((buffer, bytes, Rc::clone(&alive)));
        Ok((Addr { at, place }, Freed(alive)))
    }

    fn sync(&mut self) -> Result<()> {
        let queues = std::mem::take(&mut self.queues);
        for (_, queue) in queues.into_iter().rev() {
            for (dst, src, bytes) in queue {
                self.check(dst.at, bytes);
                self.check(src.at, bytes);
                // SAFETY: the ranges were checked just above to lie inside the test's
                // buffers or live scratch.
                unsafe { std::ptr::copy(src.at as *const u8, dst.at as *mut u8, bytes) };
            }
        }
        Ok(())
    }

    fn tuning(&self) -> Tuning {
        self.tuning
    }
}

pub fn emulator(refuse_pitched: bool, tuning: Tuning, sides: [&Side; 2]) -> Emulator {
    Emulator {
        queues: Default::default(),
        scratch: Vec::new(),
        buffers: sides
            .iter()
            .map(|side| (side.bytes.as_ptr() as usize, side.bytes.len()))
            .collect(),
        refuse_pitched,
        tuning,
        pitched_calls: 0,
        linear_calls: 0,
    }
}

/// A buffer of `len` bytes with a view into it at `offset`.
pub struct Side {
    pub bytes: Vec<u8>,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub place: Place,
}

impl Side {
    pub fn view(&mut self) -> View {
        View {
            base: Addr {
                at: self.bytes.as_mut_ptr() as usize + self.offset,
                place: self.place,
            },
            shape: self.shape.clone(),
            strides: self.strides.clone(),
        }
    }

    pub fn element(&self, index: &[usize], itemsize: usize) -> &[u8] {
        let at = index
            .iter()
            .zip(&self.strides)
            .fold(self.offset as isize, |acc, (&i, &s)| acc + i as isize * s);
        &self.bytes[at as usize..at as usize + itemsize]
    }
}

/// Strides (in items, possibly negative or zero) for `shape`, and the buffer that holds them.
pub fn side(shape: &[usize], steps: &[isize], itemsize: usize, place: Place, fill: u8) -> Side {
    let strides: Vec<isize> = steps.iter().map(|&s| s * itemsize as isize).collect();
    let view = View {
        base: Addr { at: 0, place },
        shape: shape.to_vec(),
        strides: strides.clone(),
    };
    let (low, high) = view.span(itemsize);
    let len = (high - low) as usize + 16;
    let bytes: Vec<u8> = (0..len)
        .map(|i| fill.wrapping_add((i * 7 % 251) as u8))
        .collect();
    Side {
        bytes,
        offset: (-low) as usize + 3,
        shape: shape.to_vec(),
        strides,
        place,
    }
}
