//! A receiver's side of lending (see `lender`): each producer's release board, mapped once, on
//! which tokens are released; and one connection to each producer, kept to save a connect per
//! handle (it holds nothing), on which tokens are claimed (and released, where the board can't
//! be had).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::io::Errno;

use super::board::Board;
use super::lender::{
    ANSWER_TIMEOUT, Address, CLAIM, GRANTED, REFUSED, RELEASE, TOKEN_BYTES, Token, slot_of,
};
use super::per_process::PerProcess;
use dlpack_core::error::describe;
use dlpack_core::error::{Error, Result};
use dlpack_core::share::{Stream, system};

/// Receivers keep connections to (and boards of) at most this many producers.
const MAX_PRODUCERS: usize = 32;

/// A connection; its lock pairs each claim with its answer.
struct Connection(Mutex<Stream>);

static CONNECTIONS: PerProcess<HashMap<Address, Arc<Connection>>> = PerProcess::new(HashMap::new);

/// Producers' boards, `None` where one can't be had (no /proc of theirs here).
static BOARDS: PerProcess<HashMap<Address, Option<Arc<Board>>>> = PerProcess::new(HashMap::new);

/// Releases that could not be given for want of descriptors, given with the next release.
static PENDING: PerProcess<Vec<(Address, Token)>> = PerProcess::new(Vec::new);

/// Whether releases wait (so that a release looks at `PENDING` only then).
static WAITING: AtomicBool = AtomicBool::new(false);

/// At most this many releases wait: beyond, they are dropped (their segments stay pinned in
/// their producers until those exit, as for a pickle never opened).
const MAX_PENDING: usize = 4096;

/// No lender listens at the address (connecting is refused): its random id names one process's
/// lender, so the producer is gone, or runs in another network namespace.
fn gone(pid: i32) -> Error {
    Error::buffer(format!(
        "the process that shared this memory (pid {pid}) can't be reached (nothing listens at \
         its lender's address): it has exited, and nothing else held the memory for this handle \
         (a producer must live until the handles it sent have been received), or it runs in \
         another container"
    ))
}

/// The error of a receiver whose producer's lender serves another user.
fn another_user(pid: i32, theirs: u32, ours: u32) -> Error {
    Error::buffer(format!(
        "the process that shared this memory (pid {pid}) runs as uid {theirs}, and this process \
         as uid {ours}: a handle opens only in a process of the same user as its producer (its \
         lender serves no other user), or in one the kernel lets open the producer's \
         descriptors through /proc (such as root's)"
    ))
}

fn connection(address: Address) -> Result<Arc<Connection>> {
    let mut connections = CONNECTIONS.lock();
    if let Some(connection) = connections.get(&address) {
        return Ok(connection.clone());
    }
    let pid = address.pid;
    let name = address.name();
    let stream = Stream::connect(name.as_bytes(), ANSWER_TIMEOUT).map_err(|err| match err {
        Error::Os {
            errno: Errno::CONNREFUSED,
            ..
        } => gone(pid),
        // Out of descriptors: the caller names the limit.
        Error::Os {
            errno: Errno::MFILE | Errno::NFILE,
            ..
        } => err,
        Error::Os { errno, .. } => Error::buffer(format!(
            "can't connect to the process that shared this memory (pid {pid}): {}",
            describe(errno)
        )),
        other => other,
    })?;
    // Its lender closes another user's connection unanswered: known here from the credentials
    // the kernel gives the connection, without asking.
    let (theirs, ours) = (stream.peer_uid()?, system::uid());
    if theirs != ours {
        return Err(another_user(pid, theirs, ours));
    }
    if connections.len() >= MAX_PRODUCERS {
        connections.clear();
    }
    let connection = Arc::new(Connection(Mutex::new(stream)));
    connections.insert(address, connection.clone());
    Ok(connection)
}

/// Descriptors held for other processes' lenders: their boards mapped, and connections.
pub fn descriptors() -> usize {
    let boards = BOARDS
        .lock()
        .values()
        .filter(|board| board.is_some())
        .count();
    boards + CONNECTIONS.lock().len()
}

fn forget(address: Address, connection: &Arc<Connection>) {
    let mut connections = CONNECTIONS.lock();
    if connections
        .get(&address)
        .is_some_and(|kept| Arc::ptr_eq(kept, connection))
    {
        connections.remove(&address);
    }
}

fn message(op: u8, token: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(1 + TOKEN_BYTES);
    message.push(op);
    message.extend_from_slice(token);
    message
}

/// Claim `token` from the lender at `address`: a descriptor, ours to close (then `release` the
/// token). A buffer error when the producer is gone, serves another user, or refuses; the
/// system call's error when this process is out of descriptors.
pub fn claim(address: Address, token: &[u8]) -> Result<OwnedFd> {
    let pid = address.pid;
    let request = message(CLAIM, token);
    let mut why = String::new();
    for _attempt in 0..2 {
        let connection = connection(address)?;
        let mut answer = [0u8; 4096];
        let received = {
            let stream = connection.0.lock().unwrap_or_else(PoisonError::into_inner);
            match stream
                .send(&request, None)
                .and_then(|()| stream.receive(&mut answer))
            {
                // Closed by the lender (the kernel says so first, before what was sent): it
                // may have said why before closing (a lender at its limit of open files takes
                // a connection only to refuse it).
                Err(
                    err @ Error::Os {
                        errno: Errno::PIPE | Errno::CONNRESET,
                        ..
                    },
                ) => match stream.receive(&mut answer) {
                    Ok(said @ (1.., _)) => Ok(said),
                    _ => Err(err),
                },
                other => other,
            }
        };
        match received {
            Ok((len @ 1.., fd)) => match (answer[0], fd) {
                (GRANTED, Some(fd)) => return Ok(fd),
                (REFUSED, _) => {
                    return Err(Error::buffer(
                        String::from_utf8_lossy(&answer[1..len]).into_owned(),
                    ));
                }
                _ => why = "it answered what no lender says".to_owned(),
            },
            Ok(_) => why = "it closed the connection".to_owned(),
            Err(Error::Os {
                errno: Errno::AGAIN,
                ..
            }) => {
                // A late answer must not be read as the next claim's: this connection goes.
                forget(address, &connection);
                return Err(Error::buffer(format!(
                    "the process that shared this memory (pid {pid}) did not answer within {} s",
                    ANSWER_TIMEOUT.as_secs()
                )));
            }
            // Out of descriptors (the one sent could not be received; the connection stays in
            // step): the caller names the limit.
            Err(
                err @ Error::Os {
                    errno: Errno::MFILE | Errno::NFILE,
                    ..
                },
            ) => return Err(err),
            Err(err) => {
                why = match err.errno() {
                    Some(errno) => describe(errno),
                    None => err.to_string(),
                }
            }
        }
        // The connection was to an earlier incarnation's socket, or broke: one fresh try (which
        // finds the producer gone, if it is).
        forget(address, &connection);
    }
    Err(Error::buffer(format!(
        "the process that shared this memory (pid {pid}) did not lend it: {why}"
    )))
}

/// Whether `err` is a lack of something that may come back (descriptors, memory): what failed
/// is tried again later, not given up on for the rest of the process.
fn transient(err: &Error) -> bool {
    matches!(err, Error::Memory(_))
        || matches!(
            err.errno(),
            Some(Errno::MFILE | Errno::NFILE | Errno::NOMEM | Errno::AGAIN | Errno::INTR)
        )
}

/// The board of the lender at `address`, mapped once; `None` where it can't be had (for good,
/// or only for now: then not remembered, so a later release maps it).
fn board(address: Address) -> Option<Arc<Board>> {
    let mut boards = BOARDS.lock();
    if let Some(board) = boards.get(&address) {
        return board.clone();
    }
    let board = match Board::open(address.pid, address.board_fd, address.id) {
        Ok(board) => Some(Arc::new(board)),
        Err(err) if transient(&err) => return None,
        Err(_) => None,
    };
    if boards.len() >= MAX_PRODUCERS {
        boards.clear();
    }
    boards.insert(address, board.clone());
    board
}

/// Give `token` back to the lender at `address` without waiting for it: on its board, or else
/// by a message sent only if the socket has room (nothing to do when the producer is gone: its
/// pins went with it). Where neither can be had for want of descriptors, it is given with a
/// later release.
pub fn release(address: Address, token: &[u8]) {
    if give(address, token) {
        if WAITING.load(Ordering::Acquire) {
            give_waiting();
        }
        return;
    }
    let mut pending = PENDING.lock();
    if pending.len() < MAX_PENDING
        && let Ok(token) = Token::try_from(token)
    {
        pending.push((address, token));
        WAITING.store(true, Ordering::Release);
    }
}

/// Give the releases that wait, keeping those that still can't be given.
fn give_waiting() {
    let waiting = std::mem::take(&mut *PENDING.lock());
    let still: Vec<(Address, Token)> = waiting
        .into_iter()
        .filter(|(address, token)| !give(*address, token))
        .collect();
    let mut pending = PENDING.lock();
    pending.extend(still);
    WAITING.store(!pending.is_empty(), Ordering::Release);
}

/// `release`, once: false where it could not be given for want of descriptors.
fn give(address: Address, token: &[u8]) -> bool {
    if let Some((slot, nonce)) = slot_of(token)
        && let Some(board) = board(address)
    {
        board.release(slot, nonce); // false: released already
        return true;
    }
    let connection = match connection(address) {
        Ok(connection) => connection,
        Err(err) => return !transient(&err),
    };
    // Never waiting: a stopped producer (SIGSTOP, a debugger, a long call holding its GIL)
    // must not stall receivers. A release its full buffer can't take is dropped: the segment
    // stays pinned in the producer until it exits, as for a pickle never opened.
    let sent = {
        let stream = connection.0.lock().unwrap_or_else(PoisonError::into_inner);
        stream.try_send(&message(RELEASE, token))
    };
    if sent.is_err() {
        forget(address, &connection);
    }
    true
}

/// In a forked child: the parent's connections are the parent's; the child closes its copies.
pub fn renew_in_child() {
    if let Some(mut old) = CONNECTIONS.renew() {
        old.clear();
    }
    if let Some(mut old) = BOARDS.renew() {
        old.clear();
    }
    drop(PENDING.renew()); // the parent's to give
}
