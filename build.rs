//! Two things for the build:
//! - the git commit palletd is built from, for `palletd --version` and the
//!   status page: `PALLETD_COMMIT` from the environment (a package built
//!   from a source tarball), else `git rev-parse`, else "unknown";
//! - the Rust types of the Sparkplug B payload schema
//!   (proto/sparkplug_b.proto), by prost-build. The schema is parsed by
//!   protox, in Rust, so building palletd needs no `protoc`.

use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=PALLETD_COMMIT");
    for path in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("PALLETD_COMMIT").ok().or_else(|| {
        let out = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    println!(
        "cargo:rustc-env=PALLETD_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );

    println!("cargo:rerun-if-changed=proto/sparkplug_b.proto");
    let files = protox::compile(["proto/sparkplug_b.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(files)?;
    Ok(())
}
