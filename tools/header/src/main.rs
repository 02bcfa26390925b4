//! `cargo run -p dlpack-header`: writes `dlpack/include/dlpack_adapter.h`, the C header of the
//! runtime's C API, from its one declaration (`crates/dlpack-adapter/src/capi.rs`) through
//! cbindgen and `tools/header/cbindgen.toml`; with `--check`, writes nothing and fails where the
//! file differs from what it would write (`make lint`).

use std::path::Path;
use std::process::ExitCode;

const HEADER: &str = "dlpack/include/dlpack_adapter.h";
const DECLARATIONS: &str = "crates/dlpack-adapter/src/capi.rs";
const CONFIG: &str = "tools/header/cbindgen.toml";

fn main() -> ExitCode {
    let check = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => false,
        [flag] if flag == "--check" => true,
        _ => {
            eprintln!("usage: cargo run -p dlpack-header [-- --check]");
            return ExitCode::from(2);
        }
    };
    match generate() {
        Ok(header) => compare_or_write(header, check),
        Err(err) => {
            eprintln!("dlpack-header: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The header, as cbindgen writes it from the declarations.
fn generate() -> Result<Vec<u8>, String> {
    let root = root();
    let config = cbindgen::Config::from_file(root.join(CONFIG))?;
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join(DECLARATIONS))
        .generate()
        .map_err(|err| format!("cbindgen failed on {DECLARATIONS}: {err}"))?;
    let mut header = Vec::new();
    bindings.write(&mut header);
    Ok(header)
}

fn compare_or_write(header: Vec<u8>, check: bool) -> ExitCode {
    let path = root().join(HEADER);
    let current = std::fs::read(&path).ok();
    if current.as_deref() == Some(header.as_slice()) {
        return ExitCode::SUCCESS;
    }
    if check {
        eprintln!(
            "{HEADER} is not what {DECLARATIONS} declares: run `cargo run -p dlpack-header` and \
             commit the header"
        );
        return ExitCode::FAILURE;
    }
    if let Err(err) = std::fs::write(&path, header) {
        eprintln!("dlpack-header: can't write {}: {err}", path.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {HEADER}");
    ExitCode::SUCCESS
}

/// The repository's root, two folders above this crate.
fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}
