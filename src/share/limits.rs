//! The errors of sharing at a limit of open files, alike on every side (sharing, pickling a
//! handle, opening one): they name the limit reached, what sharing holds of it in this process,
//! and what to do.

use rustix::io::Errno;

use super::mapped::Mapped;
use super::{client, lender, pool};
use dlpack_core::error::{Error, describe};
use dlpack_core::share::system;

/// `err`, where it is a lack of descriptors met trying `to` (e.g. "open this handle"), as the
/// error that names the limit reached and what sharing holds of it here; any other as it is.
pub fn out_of_files(err: Error, to: &str) -> Error {
    let Error::Os { call, errno } = err else {
        return err;
    };
    let what = format!("{call}: {}", describe(errno));
    let msg = match errno {
        Errno::MFILE => {
            let (soft, hard) = system::open_files_limit();
            let count =
                |limit: Option<u64>| limit.map_or("unlimited".to_owned(), |n| n.to_string());
            format!(
                "too many open files to {to} ({what}): RLIMIT_NOFILE, soft limit {} (hard limit \
                 {}), is reached. Sharing holds a descriptor for each segment as long as arrays \
                 of it live here (views of one array, or of one empty_shared array, share it; \
                 {} segments are mapped here now), for each handle pickled here until its \
                 receiver opens it ({} wait; one never opened holds its segment until this \
                 process exits) and for each segment kept for reuse ({}); producers' release \
                 boards and connections hold {}. Raise the soft limit \
                 (resource.setrlimit(resource.RLIMIT_NOFILE, ...), ulimit -n) or let go of \
                 shared arrays",
                count(soft),
                count(hard),
                Mapped::live(),
                lender::pinned(),
                pool::kept(),
                client::descriptors(),
            )
        }
        Errno::NFILE => format!(
            "too many open files in the system to {to} ({what}): the system-wide limit (the \
             fs.file-max sysctl) is reached"
        ),
        _ => return Error::Os { call, errno },
    };
    Error::Limit { errno, msg }
}

/// `out_of_files` for an error of the extension's (an exception Python raised is left as it is).
pub fn explained(err: crate::error::Error, to: &str) -> crate::error::Error {
    match err {
        crate::error::Error::Core(err) => out_of_files(err, to).into(),
        other => other,
    }
}
