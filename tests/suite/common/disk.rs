//! Disk faults: a small tmpfs to fill, libfiu to make writes fail.

use super::*;

/// A small tmpfs, mounted for one test (a disk to fill); unmounted when
/// dropped. Needs root, as `mount` does.
pub struct Tmpfs {
    pub dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=`, e.g. "3m").
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run mount: {e}"));
        assert!(
            out.status.success(),
            "cannot mount a tmpfs (this test needs root, as CI has): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// libfiu's remote control of a process started under `fiu-run -x -f
/// <fifo>`: runs `fiu-ctrl -c <command>...` on it.
pub fn fiu_ctrl(fifo: &Path, pid: u32, commands: &[&str]) {
    let mut c = Command::new("fiu-ctrl");
    c.arg("-f").arg(fifo);
    for command in commands {
        c.args(["-c", command]);
    }
    let out = c
        .arg(pid.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run fiu-ctrl: {e}; {INSTALL_HINT}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("Error"),
        "fiu-ctrl failed: {err}"
    );
}
