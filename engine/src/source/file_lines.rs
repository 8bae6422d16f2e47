//! The lines of a file, read with a bound on what is held: a line longer than the bound is
//! passed over piece by piece, keeping only its first bytes and its length.
//!
//! # Guarantee
//!
//! Reading a line holds at most the bound plus [`READ_BUFFER`] bytes (the line's buffer never
//! grows past that) and the read buffer, however long the line.
//! Every byte of the file is counted in exactly one line, so the byte offsets a reader adds up
//! are the file's own (a checkpoint after any line, too long or not, is exact).
//!
//! # What it does not cover
//!
//! A line ends at `\n` only: a `\r` before it is part of the line (and of its length).

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Bytes asked of the file at a time.
pub(crate) const READ_BUFFER: usize = 64 * 1024;

/// What is kept of a line over the bound: enough for a person to recognise it in a dead
/// letter, small enough that a dead letter never carries a large part of it.
pub(crate) const KEPT_OF_A_LONG_LINE: usize = 1024;

/// One line read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LineRead {
    /// Bytes of the file it took, its `\n` included.
    pub(crate) bytes: u64,
    /// Its length without the `\n` when that is over the bound (the buffer then holds only
    /// its first [`KEPT_OF_A_LONG_LINE`] bytes); `None` when it fits.
    pub(crate) too_long: Option<u64>,
}

/// Reads the lines of `R`, none held beyond `max` bytes.
pub(crate) struct BoundedLines<R> {
    reader: BufReader<R>,
    max: usize,
}

impl<R: AsyncRead + Unpin> BoundedLines<R> {
    /// Lines of `inner` of at most `max` bytes each (without the `\n`).
    pub(crate) fn new(inner: R, max: usize) -> Self {
        Self {
            reader: BufReader::with_capacity(READ_BUFFER, inner),
            max,
        }
    }

    /// Reads the next line into `line` (cleared first; with its `\n` when it has one); `None`
    /// at the end of the file. A line over the bound that holds only whitespace comes back
    /// empty and fitting, like any blank line.
    pub(crate) async fn next_line(
        &mut self,
        line: &mut Vec<u8>,
    ) -> std::io::Result<Option<LineRead>> {
        line.clear();
        let mut bytes = 0u64;
        let mut over = false;
        let mut blank = true;
        let mut ended = false;
        while !ended {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                break;
            }
            let piece = match available.iter().position(|b| *b == b'\n') {
                Some(at) => {
                    ended = true;
                    &available[..=at]
                }
                None => available,
            };
            let taken = piece.len();
            if over {
                blank &= piece.iter().all(u8::is_ascii_whitespace);
            } else {
                reserve_within(line, taken, self.max.saturating_add(READ_BUFFER));
                line.extend_from_slice(piece);
                if line.len() - usize::from(ended) > self.max {
                    over = true;
                    blank = line.iter().all(u8::is_ascii_whitespace);
                    line.truncate(KEPT_OF_A_LONG_LINE.min(self.max));
                }
            }
            bytes += taken as u64;
            self.reader.consume(taken);
        }
        if bytes == 0 {
            return Ok(None);
        }
        if over && blank {
            line.clear();
            over = false;
        }
        Ok(Some(LineRead {
            bytes,
            too_long: over.then(|| bytes - u64::from(ended)),
        }))
    }
}

/// Makes room for `more` bytes in `line`, growing it as a `Vec` does (doubling) but never past
/// `ceiling` (which `line.len() + more` never exceeds).
fn reserve_within(line: &mut Vec<u8>, more: usize, ceiling: usize) {
    let needed = line.len() + more;
    if needed > line.capacity() {
        let grown = (line.capacity() * 2).clamp(needed, ceiling.max(needed));
        line.reserve_exact(grown - line.len());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Every line of `text` read with bound `max`: the buffer's content and what was read.
    async fn lines(text: &[u8], max: usize) -> Vec<(Vec<u8>, LineRead)> {
        let mut reader = BoundedLines::new(text, max);
        let mut line = Vec::new();
        let mut out = Vec::new();
        while let Some(read) = reader.next_line(&mut line).await.unwrap() {
            out.push((line.clone(), read));
        }
        out
    }

    fn fits(bytes: u64) -> LineRead {
        LineRead {
            bytes,
            too_long: None,
        }
    }

    #[tokio::test]
    async fn lines_up_to_the_bound_are_whole_and_longer_ones_keep_their_head() {
        let read = lines(b"abcd\nabcde\nab\r\n\nxyz", 4).await;
        assert_eq!(
            read,
            vec![
                (b"abcd\n".to_vec(), fits(5)),
                (
                    b"abcd".to_vec(),
                    LineRead {
                        bytes: 6,
                        too_long: Some(5)
                    }
                ),
                (b"ab\r\n".to_vec(), fits(4)),
                (b"\n".to_vec(), fits(1)),
                (b"xyz".to_vec(), fits(3)),
            ]
        );
    }

    #[tokio::test]
    async fn a_line_many_buffers_long_is_counted_whole_and_never_held() {
        let long = READ_BUFFER * 5 + 17;
        let mut text = b"first\n".to_vec();
        text.resize(text.len() + long, b'x');
        text.extend_from_slice(b"\nlast\n");
        let mut reader = BoundedLines::new(&text[..], 100);
        let mut line = Vec::new();
        reader.next_line(&mut line).await.unwrap().unwrap();
        let read = reader.next_line(&mut line).await.unwrap().unwrap();
        assert_eq!(
            read,
            LineRead {
                bytes: long as u64 + 1,
                too_long: Some(long as u64)
            }
        );
        assert_eq!(line, vec![b'x'; 100]);
        assert!(line.capacity() <= 100 + READ_BUFFER, "{}", line.capacity());
        let read = reader.next_line(&mut line).await.unwrap().unwrap();
        assert_eq!((line.as_slice(), read), (&b"last\n"[..], fits(5)));
        assert!(reader.next_line(&mut line).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_long_line_without_an_end_and_a_long_blank_line() {
        let mut text = vec![b' '; 3 * READ_BUFFER];
        text.extend_from_slice(b"\n");
        text.extend_from_slice(&[b'y'; 2000]);
        let read = lines(&text, 10).await;
        assert_eq!(read[0], (Vec::new(), fits(3 * READ_BUFFER as u64 + 1)));
        assert_eq!(
            read[1],
            (
                vec![b'y'; 10],
                LineRead {
                    bytes: 2000,
                    too_long: Some(2000)
                }
            )
        );
        assert_eq!(read.len(), 2);
    }

    #[tokio::test]
    async fn no_bound_at_all() {
        let read = lines(b"abc\nde", usize::MAX).await;
        assert_eq!(
            read,
            vec![(b"abc\n".to_vec(), fits(4)), (b"de".to_vec(), fits(2))]
        );
    }

    #[tokio::test]
    async fn the_kept_head_is_bounded_too() {
        let text = vec![b'z'; 5000];
        let read = lines(&text, 3000).await;
        assert_eq!(read[0].0, vec![b'z'; KEPT_OF_A_LONG_LINE]);
        assert_eq!(read[0].1.too_long, Some(5000));
    }
}
