//! The memory and leaves of a shared tree's last snapshots, kept to be handed out again once
//! nothing holds them: a thousand small leaves cost as much to make as their copy, and fresh
//! memory faults its pages in as the copy writes them. The copy itself, under the sequence
//! lock, is the parent module's (`TreeSegment::copy_out`).

use std::sync::{Arc, Mutex, PoisonError};

use dlpack_core::abi::DLDevice;
use dlpack_core::layout::Layout;
use dlpack_core::memory::AlignedBuffer;
use dlpack_core::share::tree::TreeLayout;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::error::{Error, Result};
use crate::ffi::python;
use crate::object::{Described, empty_view, new_view};
use crate::tensor::Owner;

/// A snapshot's memory and the leaves over it, and the dict it was handed out as (a state
/// dict's), kept to be handed out again once nothing else holds them. A snapshot claims one by
/// taking it out of the tree's list (`KeptSnapshots::claim`), so no other can meanwhile, and
/// puts it back once it has handed it out (`KeptSnapshots::keep`).
pub(super) struct Kept {
    buffer: Arc<AlignedBuffer>,
    leaves: Vec<Py<PyAny>>,
    dict: Option<KeptDict>,
}

/// A state dict a snapshot was handed out as: its keys in order, the leaves its values.
struct KeptDict {
    dict: Py<PyDict>,
    /// The keys as the caller gave them (the same tuple hands the dict out again).
    keys: Py<PyTuple>,
    /// The same keys, one by one (compared with the dict's without touching the tuple).
    each_key: Vec<Py<PyAny>>,
}

impl Kept {
    /// Whether nothing but this tree holds its leaves, nor its dict where it has one, and that
    /// dict still holds exactly its keys and leaves in order (a dict changed after it was handed
    /// out, or held elsewhere, is not handed out again, nor are its leaves).
    fn unheld(&self, py: Python<'_>) -> bool {
        match &self.dict {
            None => (self.leaves.iter()).all(|leaf| python::sole_reference(leaf.bind(py))),
            Some(kept) => {
                let dict = kept.dict.bind(py);
                python::sole_reference(dict.as_any())
                    && python::dict_holds_alone(dict, &kept.each_key, &self.leaves)
            }
        }
    }

    /// The snapshot's leaves: as a list, or with `keys` as a dict of them (its dict, where it
    /// has one of those keys, else made now and kept with it).
    pub(super) fn hand_out<'py>(
        &mut self,
        py: Python<'py>,
        keys: Option<&Bound<'py, PyTuple>>,
    ) -> Result<Bound<'py, PyAny>> {
        let Some(keys) = keys else {
            return Ok(PyList::new(py, self.leaves.iter().map(|leaf| leaf.bind(py)))?.into_any());
        };
        if let Some(dict) = &self.dict
            && dict.keys.bind(py).is(keys)
        {
            return Ok(dict.dict.bind(py).clone().into_any());
        }
        let dict = PyDict::new(py);
        for (key, leaf) in keys.iter().zip(&self.leaves) {
            dict.set_item(key, leaf.bind(py))?;
        }
        // Keys equal to one another would leave fewer entries than leaves.
        if dict.len() != self.leaves.len() {
            return Err(Error::value(
                "a state dict's snapshot needs keys that differ",
            ));
        }
        self.dict = Some(KeptDict {
            dict: dict.clone().unbind(),
            keys: keys.clone().unbind(),
            each_key: keys.iter().map(Bound::unbind).collect(),
        });
        Ok(dict.into_any())
    }
}

/// A snapshot's memory: a kept snapshot's, claimed, or new.
pub(super) enum Memory {
    Kept(Kept),
    New(Arc<AlignedBuffer>),
}

impl Memory {
    pub(super) fn buffer(&self) -> &Arc<AlignedBuffer> {
        match self {
            Memory::Kept(kept) => &kept.buffer,
            Memory::New(buffer) => buffer,
        }
    }

    /// The snapshot's memory and leaves: a kept snapshot's, or for new memory (which holds the
    /// leaves' bytes from the data's start) new leaves over it, each of its C-ordered layout in
    /// `c_layouts`.
    pub(super) fn into_kept(
        self,
        py: Python<'_>,
        tree: &TreeLayout,
        c_layouts: &[Layout],
    ) -> Result<Kept> {
        let buffer = match self {
            Memory::Kept(kept) => return Ok(kept),
            Memory::New(buffer) => buffer,
        };
        let data = tree.data().0;
        let mut leaves = Vec::with_capacity(tree.leaves().len());
        let placed = tree.leaves().iter().zip(tree.placed());
        for ((leaf, placed), layout) in placed.zip(c_layouts) {
            let layout = layout.clone();
            let view = if placed.nbytes == 0 {
                empty_view(py, leaf.element, layout, false)?
            } else {
                let described = Described {
                    data: buffer
                        .as_ptr()
                        .wrapping_add((placed.offset - data) as usize)
                        .cast(),
                    device: DLDevice::CPU,
                    element: leaf.element,
                    layout,
                    readonly: false,
                };
                // SAFETY: the leaf's bytes lie at its offset into the data, which the buffer
                // holds (the data's length from its start), ours and writable, alive while the
                // owner holds it.
                unsafe { new_view(py, Owner::RustValue(buffer.clone()), described)? }
            };
            leaves.push(view.unbind());
        }
        Ok(Kept {
            buffer,
            leaves,
            dict: None,
        })
    }
}

/// How many snapshots' memory a tree keeps: two, so that a loop holding its last snapshot while
/// it takes the next (`snap = tree.snapshot()`) reuses the one before.
const SNAPSHOTS_KEPT: usize = 2;

/// A tree's last snapshots (memory and leaves), kept to be handed out again.
pub(super) struct KeptSnapshots {
    kept: Mutex<Vec<Kept>>,
    /// How many of a snapshot's leaves are views of its memory (the others are empty).
    views: usize,
}

impl KeptSnapshots {
    pub(super) fn new(layout: &TreeLayout) -> KeptSnapshots {
        let views = (layout.placed().iter())
            .filter(|placed| placed.nbytes > 0)
            .count();
        KeptSnapshots {
            kept: Mutex::new(Vec::new()),
            views,
        }
    }

    /// Memory for a snapshot of `len` bytes: an earlier snapshot's that nothing holds any more
    /// (no reference to its leaves or dict but ours, no view or export of its memory: every
    /// holder of it holds a leaf, or a reference to the memory, which its count tells), with
    /// its leaves, taken out of `kept`; else new (a MemoryError before allocating what can't be
    /// had). A fresh allocation faults its pages in as the copy writes them, which costs many
    /// times the copy, and a thousand small leaves cost as much to make as their copy.
    pub(super) fn claim(&self, py: Python<'_>, len: usize) -> Result<Memory> {
        let claimed = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            // Nothing outside this tree refers to an unheld entry's leaves, dict or memory, so
            // no thread can make a new reference to them (a reference is made from one), with
            // or without the GIL; taken out of `kept` under its lock, it is this snapshot's.
            let free = kept.iter().position(|kept| {
                Arc::strong_count(&kept.buffer) == 1 + self.views && kept.unheld(py)
            });
            free.map(|at| kept.remove(at))
        };
        Ok(match claimed {
            Some(kept) => Memory::Kept(kept),
            None => Memory::New(Arc::new(AlignedBuffer::new(len)?)),
        })
    }

    /// Keep a snapshot's memory and leaves for later ones, as the newest (the oldest let go of,
    /// beyond `SNAPSHOTS_KEPT`: its snapshot, if alive, still holds it).
    pub(super) fn keep(&self, newest: Kept) {
        let dropped = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            kept.push(newest);
            (kept.len() > SNAPSHOTS_KEPT).then(|| kept.remove(0))
        };
        drop(dropped); // its references let go of outside the lock
    }
}
