//! Relative paths in a pipeline file mean the same from any working directory: a SQLite store
//! (`sqlite://state/shop.db`, and the default store), a file source's glob, a sink's folder, a
//! decode's schema file and the control token file are resolved against the folder of the
//! pipeline file. Absolute paths are kept as written. A store given in the environment
//! (`SLUICE_STORE`) is not from the file and stays relative to the working directory.

use std::path::{Path, PathBuf};

/// `given` as seen from the pipeline file `file`: joined to the file's folder when relative.
pub(crate) fn beside(file: &Path, given: &str) -> PathBuf {
    match folder(file) {
        Some(dir) if Path::new(given).is_relative() => dir.join(given),
        _ => PathBuf::from(given),
    }
}

/// A store URL as seen from `file`: a relative `sqlite://PATH` joined to the file's folder;
/// other URLs unchanged.
pub(crate) fn store_beside(file: &Path, store: String) -> String {
    match store.strip_prefix("sqlite://") {
        Some(path) if !path.is_empty() => {
            format!("sqlite://{}", beside(file, path).to_string_lossy())
        }
        _ => store,
    }
}

/// A file source's glob as seen from `file`: the folder is escaped, so that a folder holding
/// `[` or `*` matches only itself.
pub(crate) fn glob_beside(file: &Path, pattern: String) -> String {
    match folder(file) {
        Some(dir) if Path::new(&pattern).is_relative() => {
            let dir = glob::Pattern::escape(&dir.to_string_lossy());
            format!("{}/{pattern}", dir.trim_end_matches('/'))
        }
        _ => pattern,
    }
}

/// The pipeline file's folder, when it has one other than the working directory.
fn folder(file: &Path) -> Option<&Path> {
    file.parent().filter(|dir| !dir.as_os_str().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_beside_the_file_and_absolute_ones_kept() {
        let file = Path::new("/srv/shop/pipeline.yaml");
        assert_eq!(
            beside(file, "keys/token"),
            Path::new("/srv/shop/keys/token")
        );
        assert_eq!(beside(file, "/etc/token"), Path::new("/etc/token"));
        assert_eq!(
            store_beside(file, "sqlite://state/shop.db".into()),
            "sqlite:///srv/shop/state/shop.db"
        );
        assert_eq!(
            store_beside(file, "sqlite:///var/shop.db".into()),
            "sqlite:///var/shop.db"
        );
        assert_eq!(
            store_beside(file, "postgres://u@h/db".into()),
            "postgres://u@h/db"
        );
        assert_eq!(
            glob_beside(Path::new("/srv/[a]/p.yaml"), "in/*.jsonl".into()),
            "/srv/[[]a[]]/in/*.jsonl"
        );
        assert_eq!(glob_beside(file, "/in/*.jsonl".into()), "/in/*.jsonl");
    }

    #[test]
    fn a_file_in_the_working_directory_keeps_its_paths() {
        let file = Path::new("pipeline.yaml");
        assert_eq!(beside(file, "out"), Path::new("out"));
        assert_eq!(
            store_beside(file, "sqlite://state/a.db".into()),
            "sqlite://state/a.db"
        );
        assert_eq!(glob_beside(file, "in/*.jsonl".into()), "in/*.jsonl");
    }
}
