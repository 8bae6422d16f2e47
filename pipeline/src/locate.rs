//! Source positions for paths such as `flows[1].depends_on`.
//!
//! Serde forgets where a value came from; the checks that run after deserialisation (unknown
//! targets, duplicate names, ranges) still need a line and column. The [`Locator`] reads the YAML
//! event stream once (with the parser that `serde-saphyr` itself uses) and remembers, for every
//! node, the position to report:
//!
//! - a scalar: where the scalar starts (`window: 10x` points at `10x`);
//! - a mapping or sequence that is a mapping value: where its key starts (`source:`);
//! - a sequence item: where the item starts.
//!
//! It also notes keys repeated within one mapping, with their full path.

use std::collections::{HashMap, HashSet};

use serde_saphyr::granit_parser::{Event, Marker, Parser};

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spot {
    /// 1-based line.
    pub(crate) line: usize,
    /// 1-based column.
    pub(crate) column: usize,
}

impl Spot {
    fn from_marker(marker: &Marker) -> Self {
        Self {
            line: marker.line(),
            column: marker.col() + 1,
        }
    }
}

/// Path → position index of one YAML document (the first of the file).
#[derive(Debug, Default)]
pub(crate) struct Locator {
    spots: HashMap<String, Spot>,
    duplicates: Vec<(String, Spot)>,
}

/// A collection being walked. `path` is `None` inside complex (non-scalar) keys, whose contents
/// have no path.
enum Frame {
    Map {
        path: Option<String>,
        /// The key read and awaiting its value, with where the key starts.
        key: Option<(String, Spot)>,
        /// True while the next node is a key.
        expecting_key: bool,
        seen: HashSet<String>,
    },
    Seq {
        path: Option<String>,
        index: usize,
    },
}

/// What a starting node is, as far as the index is concerned.
enum Role {
    /// A mapping key (scalar keys are recorded by the map frame itself).
    Key,
    /// A value at this path (`None`: no path), with the key's position when it is a map value.
    Value(Option<String>, Option<Spot>),
}

impl Locator {
    /// Indexes `text`. Parsing stops at the first syntax error or at the end of the first
    /// document; whatever was read until then stays indexed.
    pub(crate) fn new(text: &str) -> Self {
        let mut locator = Self::default();
        let mut stack: Vec<Frame> = Vec::new();
        let mut started = false;
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            let here = Spot::from_marker(&span.start);
            match event {
                Event::DocumentStart(..) => {
                    if started {
                        break;
                    }
                    started = true;
                }
                Event::DocumentEnd | Event::StreamEnd => break,
                Event::Scalar(value, ..) => {
                    let role = Self::role(&stack);
                    match role {
                        Role::Key => Self::record_key(&mut locator, &mut stack, &value, here),
                        Role::Value(path, _) => {
                            if let Some(path) = path {
                                locator.spots.entry(path).or_insert(here);
                            }
                        }
                    }
                    Self::complete(&mut stack);
                }
                Event::Alias(..) => {
                    if let Role::Value(Some(path), _) = Self::role(&stack) {
                        locator.spots.entry(path).or_insert(here);
                    }
                    Self::complete(&mut stack);
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let path = match Self::role(&stack) {
                        Role::Key => None,
                        Role::Value(path, key_spot) => {
                            if let Some(path) = &path {
                                let spot = key_spot.unwrap_or(here);
                                locator.spots.entry(path.clone()).or_insert(spot);
                            }
                            path
                        }
                    };
                    stack.push(if matches!(event, Event::MappingStart(..)) {
                        Frame::Map {
                            path,
                            key: None,
                            expecting_key: true,
                            seen: HashSet::new(),
                        }
                    } else {
                        Frame::Seq { path, index: 0 }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    Self::complete(&mut stack);
                }
                _ => {}
            }
        }
        locator
    }

    /// The role of the node that starts now, given the enclosing collection.
    fn role(stack: &[Frame]) -> Role {
        match stack.last() {
            None => Role::Value(Some(String::new()), None),
            Some(Frame::Map {
                expecting_key: true,
                ..
            }) => Role::Key,
            Some(Frame::Map { path, key, .. }) => match (path, key) {
                (Some(path), Some((key, spot))) => Role::Value(Some(join(path, key)), Some(*spot)),
                _ => Role::Value(None, None),
            },
            Some(Frame::Seq { path, index }) => {
                Role::Value(path.as_ref().map(|p| format!("{p}[{index}]")), None)
            }
        }
    }

    fn record_key(&mut self, stack: &mut [Frame], key: &str, here: Spot) {
        if let Some(Frame::Map {
            path,
            key: current,
            seen,
            ..
        }) = stack.last_mut()
        {
            if !seen.insert(key.to_owned())
                && let Some(path) = path
            {
                self.duplicates.push((join(path, key), here));
            }
            *current = Some((key.to_owned(), here));
        }
    }

    /// A node has ended: the enclosing collection moves on.
    fn complete(stack: &mut [Frame]) {
        match stack.last_mut() {
            Some(Frame::Map {
                expecting_key, key, ..
            }) => {
                if !*expecting_key {
                    *key = None;
                }
                *expecting_key = !*expecting_key;
            }
            Some(Frame::Seq { index, .. }) => *index += 1,
            None => {}
        }
    }

    /// The position of `path`, or of its nearest indexed ancestor (for absent keys).
    pub(crate) fn locate(&self, path: &str) -> Option<Spot> {
        let mut path = path;
        loop {
            if let Some(spot) = self.spots.get(path) {
                return Some(*spot);
            }
            if path.is_empty() {
                return None;
            }
            path = parent(path);
        }
    }

    /// Whether `path` exists in the file exactly.
    pub(crate) fn contains(&self, path: &str) -> bool {
        self.spots.contains_key(path)
    }

    /// Keys repeated within one mapping: full path and position of the repetition.
    pub(crate) fn duplicates(&self) -> &[(String, Spot)] {
        &self.duplicates
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `a.b[2]` → `a.b`, `a.b` → `a`, `a` → ``.
fn parent(path: &str) -> &str {
    match path.rfind(['.', '[']) {
        Some(at) => &path[..at],
        None => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
pipeline: p
flows:
  - name: a
    depends_on: [x, y]
    source:
      pubsub: { subscription: s }
  - name: b
    depends_on: a
";

    fn at(l: &Locator, path: &str) -> (usize, usize) {
        let s = l.locate(path).expect("located");
        (s.line, s.column)
    }

    #[test]
    fn locates_scalars_collections_and_items() {
        let l = Locator::new(TEXT);
        assert_eq!(at(&l, "pipeline"), (1, 11));
        assert_eq!(at(&l, "flows"), (2, 1));
        assert_eq!(at(&l, "flows[0]"), (3, 5));
        assert_eq!(at(&l, "flows[0].depends_on"), (4, 5));
        assert_eq!(at(&l, "flows[0].depends_on[1]"), (4, 21));
        assert_eq!(at(&l, "flows[0].source.pubsub.subscription"), (6, 31));
        assert_eq!(at(&l, "flows[1].depends_on"), (8, 17));
        assert!(l.contains("flows[0].depends_on[0]"));
        assert!(!l.contains("flows[1].depends_on[0]"));
    }

    #[test]
    fn absent_paths_fall_back_to_the_nearest_ancestor() {
        let l = Locator::new(TEXT);
        assert_eq!(at(&l, "flows[1].source"), (7, 5));
        assert_eq!(at(&l, "flows[0].source.pubsub.dedup"), (6, 7));
    }

    #[test]
    fn notes_repeated_keys_and_survives_syntax_errors() {
        let l = Locator::new("a: 1\nb:\n  c: 1\n  c: 2\n");
        assert_eq!(l.duplicates().len(), 1);
        assert_eq!(l.duplicates()[0].0, "b.c");
        assert_eq!(l.duplicates()[0].1, Spot { line: 4, column: 3 });
        let l = Locator::new("a: 1\nb: [\n");
        assert_eq!(at(&l, "a"), (1, 4));
    }
}
