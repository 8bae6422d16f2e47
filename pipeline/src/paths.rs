//! Relative paths in a pipeline file mean the same from any working directory: a SQLite store
//! (`sqlite://state/shop.db`, and the default store), a file source's glob, a sink's folder, a
//! decode's schema file and the control token file are resolved against the folder of the
//! pipeline file, made absolute: however `-c` names the file (`shop/p.yaml`, `p.yaml` from
//! `shop/`, `/srv/shop/p.yaml`), a path comes out the same, so what is recorded under it (a
//! file backfill's checkpoint, a bad line's dead-letter key) is found again. Absolute paths
//! are kept as written. A store given in the environment (`SLUICE_STORE`) is not from the file
//! and stays relative to the working directory.

use std::path::{Path, PathBuf};

/// `given` as seen from the pipeline file `file`: joined to the file's folder when relative.
pub(crate) fn beside(file: &Path, given: &str) -> PathBuf {
    if Path::new(given).is_relative() {
        folder(file).join(given)
    } else {
        PathBuf::from(given)
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
    if Path::new(&pattern).is_relative() {
        let dir = glob::Pattern::escape(&folder(file).to_string_lossy());
        format!("{}/{pattern}", dir.trim_end_matches('/'))
    } else {
        pattern
    }
}

/// The pipeline file's folder, absolute and without `..` or links when it exists (the working
/// directory for a file named without one); as given when neither can be read.
fn folder(file: &Path) -> PathBuf {
    let dir = file
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Ok(canonical) = std::fs::canonicalize(dir) {
        return canonical;
    }
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    // `absolute` keeps a `.` it is given; a path's own `.` components mean nothing.
    absolute
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
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
    fn every_spelling_of_the_file_gives_the_same_path() {
        let cwd = std::fs::canonicalize(".").unwrap();
        let here = Path::new("p.yaml");
        let dotted = Path::new("./p.yaml");
        let absolute = cwd.join("p.yaml");
        for file in [here, dotted, absolute.as_path()] {
            assert_eq!(beside(file, "out"), cwd.join("out"), "{file:?}");
            assert_eq!(
                store_beside(file, "sqlite://state/a.db".into()),
                format!("sqlite://{}", cwd.join("state/a.db").display())
            );
        }
        // A folder that exists is named without `..`.
        let parent = cwd.parent().unwrap_or(&cwd).to_owned();
        assert_eq!(
            beside(Path::new("../p.yaml"), "in/a.jsonl"),
            std::fs::canonicalize(&parent).unwrap().join("in/a.jsonl")
        );
    }
}
