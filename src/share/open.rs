//! Opening a handle where it arrives: the segment it names, found mapped here already, or
//! opened from its producer's descriptor table through /proc, or else claimed from its lender;
//! checked to be the segment named (file, size, seals, generation) and locked before the
//! handle's token is released.

use std::sync::Arc;

use rustix::io::Errno;

use super::client;
use super::lender::{self, Address};
use super::limits::out_of_files;
use super::mapped::{Mapped, Refused, stale};
use super::segment::Segment;
use dlpack_core::error::{Error, Result};
use dlpack_core::share::memfd::{open_peer, size_mismatch};
use dlpack_core::share::{FileId, system};

/// What a handle names: its producer's lender and token, and the segment.
pub struct Named<'a> {
    pub address: Address,
    pub token: &'a [u8],
    pub writable: bool,
    pub id: FileId,
    pub size: u64,
    pub generation: u64,
    /// The number of the descriptor lent, in the producer.
    pub lent_fd: i32,
}

/// The segment `named` names if it is mapped here already (or is this process's own), without
/// waiting for anything: its token released (or, this process's own, taken). `None`: the caller
/// opens it with `open_lent`, which may wait.
pub fn open_mapped(named: &Named<'_>) -> Result<Option<Arc<Mapped>>> {
    if let Some(lender) = lender::own()
        && lender.address() == named.address
        && named.address.pid == system::pid()
    {
        let mapped = match lender.take(named.token) {
            Some(segment) => Mapped::of(same(named, &segment)?)?,
            None => {
                let mapped = Mapped::named(named.id, named.writable).ok_or_else(|| {
                    Error::buffer("this handle was already opened from its pickle, and closed")
                })?;
                same(named, mapped.segment())?;
                mapped
            }
        };
        return Ok(Some(mapped));
    }
    let Some(mapped) = Mapped::named(named.id, named.writable) else {
        return Ok(None);
    };
    let checked = same(named, mapped.segment()).map(|_| ());
    client::release(named.address, named.token);
    checked.map(|()| Some(mapped))
}

/// Map the segment another process lent (see `open_mapped` for one mapped here already):
/// opened straight from its descriptor table through /proc (no round trip; the file is
/// checked to be the segment named), or else claimed from its lender, which also says why
/// when it can't be had (waiting for its answer). The token is released once this process
/// holds its lock on the segment.
pub fn open_lent(named: &Named<'_>) -> Result<Arc<Mapped>> {
    let opened = open_or_claim(named);
    client::release(named.address, named.token);
    opened.map_err(|err| out_of_files(err, "open this handle"))
}

/// `segment`, checked to be the one `named` names as it was then.
fn same<'a>(named: &Named<'_>, segment: &'a Arc<Segment>) -> Result<&'a Arc<Segment>> {
    if segment.size() != named.size {
        return Err(size_mismatch(named.size, segment.size()));
    }
    if segment.generation() != named.generation {
        return Err(stale());
    }
    Ok(segment)
}

fn open_or_claim(named: &Named<'_>) -> Result<Arc<Mapped>> {
    let adopt = |fd, own_description| {
        Mapped::adopt(
            fd,
            named.id,
            named.size,
            named.generation,
            named.writable,
            own_description,
        )
    };
    match open_peer(named.address.pid, named.lent_fd, named.writable) {
        Ok(fd) => match adopt(fd, true) {
            Ok(mapped) => return Ok(mapped),
            Err(Refused::Stale) => return Err(stale()),
            // Not that segment (its token spent and the number reused, or another pid).
            Err(Refused::Other(Error::Buffer(_))) => {}
            Err(Refused::Other(err)) => return Err(err),
        },
        // Out of descriptors: a claim needs more.
        Err(
            err @ Error::Os {
                errno: Errno::MFILE | Errno::NFILE,
                ..
            },
        ) => return Err(err),
        // The producer exited, or /proc won't serve (another user, another pid namespace,
        // ptrace rules): claim, which says which.
        Err(_) => {}
    }
    let fd = client::claim(named.address, named.token)?;
    match adopt(fd, false) {
        Ok(mapped) => Ok(mapped),
        Err(Refused::Stale) => Err(stale()),
        Err(Refused::Other(err)) => Err(err),
    }
}
