//! What the soak samples from outside the server: its resident set, its open file descriptors
//! (from `/proc/<pid>`, so only for a server on this machine) and its data directory's size.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::BoxError;

/// The server's resident set size in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Result<u64, BoxError> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    parse_vm_rss(&status).ok_or_else(|| format!("{path} has no parsable VmRSS line").into())
}

/// `VmRSS:   1234 kB` → bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let value = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib = value
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

/// How many file descriptors the server has open (entries of `/proc/<pid>/fd`).
pub fn fd_count(pid: u32) -> Result<u64, BoxError> {
    let path = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&path).map_err(|e| format!("listing {path}: {e}"))?;
    Ok(entries.count() as u64)
}

/// Disk space used by everything under `dir`, in bytes: allocated blocks, like `du`, so a
/// preallocated or sparse file counts what it really occupies. Files that vanish while it
/// walks (retention deleting a segment) are skipped, not errors.
pub fn dir_bytes(dir: &Path) -> Result<u64, BoxError> {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d != dir => continue,
            Err(e) => return Err(format!("listing {}: {e}", d.display()).into()),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total = total.saturating_add(meta.blocks().saturating_mul(512));
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_kib() {
        let status = "Name:\tcursorlog\nVmPeak:\t  9000 kB\nVmRSS:\t   2048 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(2048 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\tlots kB\n"), None);
    }

    #[test]
    fn this_process_is_probed() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).expect("own rss") > 0);
        // At least stdin/stdout/stderr and the directory handle used to list them.
        assert!(fd_count(pid).expect("own fds") >= 3);
    }

    #[test]
    fn dir_bytes_counts_nested_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(dir_bytes(dir.path()).expect("empty dir"), 0);
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("a"), vec![1u8; 10_000]).expect("write a");
        std::fs::write(dir.path().join("sub/b"), vec![2u8; 50_000]).expect("write b");
        let bytes = dir_bytes(dir.path()).expect("dir bytes");
        assert!(bytes >= 60_000, "{bytes} bytes for 60,000 bytes of data");
        assert!(dir_bytes(&dir.path().join("missing")).is_err());
    }
}
