//! Which files a file source reads: those its glob matches, in path order.
//!
//! # Guarantee
//!
//! Every file returned is a readable file (not a directory, opened once already) whose path is
//! UTF-8; anything else fails the source at start, before a record is read. A path that is not
//! UTF-8 is refused because a file source names its files as text, in its checkpoint and in its
//! dead letters' `FILE:LINE` keys: a lossy name would stand for two files, and would compare
//! wrong against the real path when a read resumes (the rest of that file skipped).
//!
//! # What it does not cover
//!
//! A wildcard does not match a name that is not UTF-8 (the `glob` crate leaves such names out),
//! so such a file is never matched and nothing says so; only a path reached through `**` can
//! hold such a name, and that one is refused.

use crate::source::SourceError;
use std::path::PathBuf;

/// A matched file.
pub(crate) struct Matched {
    pub(crate) path: PathBuf,
    /// Its path as text (always UTF-8): its name in checkpoints and dead-letter keys.
    pub(crate) text: String,
    /// Its modification time: the publish time of its records.
    pub(crate) modified_ms: i64,
    /// Its length in bytes.
    pub(crate) len: u64,
}

/// The files matching `pattern`, in path order; every one must be a readable file.
pub(crate) fn matching_files(pattern: &str) -> Result<(Vec<Matched>, u64), SourceError> {
    let paths = glob::glob(pattern)
        .map_err(|e| SourceError::File(format!("file source {pattern:?}: bad pattern: {e}")))?;
    let mut files = Vec::new();
    let mut total = 0;
    for path in paths {
        let path = path.map_err(|e| SourceError::File(format!("cannot read {e}")))?;
        let Some(text) = path.to_str().map(str::to_owned) else {
            return Err(SourceError::File(format!(
                "{path:?} matches {pattern:?} but its path is not UTF-8: a file source names \
                 its files as text (in its checkpoint and its dead letters' keys); rename it"
            )));
        };
        let unreadable =
            |e: std::io::Error| SourceError::File(format!("cannot read {}: {e}", path.display()));
        let metadata = std::fs::metadata(&path).map_err(unreadable)?;
        if metadata.is_dir() {
            return Err(SourceError::File(format!(
                "{} matches {pattern:?} but is a directory",
                path.display()
            )));
        }
        // Opening now reports a permission problem before anything is delivered.
        std::fs::File::open(&path).map_err(unreadable)?;
        let modified_ms = metadata
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .unwrap_or_default();
        total += metadata.len();
        files.push(Matched {
            path,
            text,
            modified_ms,
            len: metadata.len(),
        });
    }
    if files.is_empty() {
        return Err(SourceError::File(format!("no file matches {pattern:?}")));
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((files, total))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_sources_fail_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = dir.path().join("*.jsonl").display().to_string();
        let error = matching_files(&pattern).err().unwrap().to_string();
        assert!(error.contains("no file matches"), "{error}");
        std::fs::create_dir(dir.path().join("d.jsonl")).unwrap();
        let error = matching_files(&pattern).err().unwrap().to_string();
        assert!(error.contains("is a directory"), "{error}");
        std::fs::remove_dir(dir.path().join("d.jsonl")).unwrap();
        std::fs::write(dir.path().join("b.jsonl"), "{}\n").unwrap();
        std::fs::write(dir.path().join("a.jsonl"), "{}\n{}\n").unwrap();
        let (files, total) = matching_files(&pattern).unwrap();
        let names: Vec<_> = files.iter().map(|f| f.path.file_name().unwrap()).collect();
        assert_eq!(names, ["a.jsonl", "b.jsonl"]);
        assert_eq!(total, 9);
    }

    #[test]
    fn a_path_that_is_not_utf8_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let latin1 = dir.path().join(std::ffi::OsStr::from_bytes(b"caf\xE9"));
        std::fs::create_dir(&latin1).unwrap();
        std::fs::write(latin1.join("a.jsonl"), "{}\n").unwrap();
        let pattern = dir.path().join("**/*.jsonl").display().to_string();
        let error = matching_files(&pattern).err().unwrap().to_string();
        assert!(error.contains(r"caf\xE9/a.jsonl"), "{error}");
        assert!(error.contains("not UTF-8"), "{error}");
    }
}
