//! The framing loop's reader: whole wire messages off a stream.

use common::limits::MESSAGE_SIZE_MAX_BYTES;
use tokio::io::AsyncReadExt;

/// Reads whole frames from a connection with as few `recv` calls as the client allows: one
/// read usually brings a whole request (or several pipelined ones), where reading the length
/// prefix and then the rest took two system calls per request.
pub struct FrameReader {
    pub buf: Vec<u8>,
    /// Unconsumed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
}

impl Default for FrameReader {
    fn default() -> FrameReader {
        FrameReader::new()
    }
}

impl FrameReader {
    const CAPACITY_BYTES: usize = 16 * 1024;
    /// After a large message, give the memory back once the buffer drains.
    const RETAINED_CAPACITY_MAX_BYTES: usize = 1024 * 1024;

    pub fn new() -> FrameReader {
        FrameReader { buf: vec![0; Self::CAPACITY_BYTES], start: 0, end: 0 }
    }

    /// The next whole frame, or None at a clean end of stream (between frames).
    pub async fn next(&mut self, stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Result<Option<std::ops::Range<usize>>, String> {
        loop {
            let available = self.end - self.start;
            let mut needed = 4;
            if available >= 4 {
                let prefix = [self.buf[self.start], self.buf[self.start + 1], self.buf[self.start + 2], self.buf[self.start + 3]];
                // Validate the length before allocating: a hostile prefix must not make us reserve 2 GB.
                let len = wire::frame_length(prefix, MESSAGE_SIZE_MAX_BYTES).map_err(|e| format!("bad frame: {}", e.message))?;
                if available >= len {
                    let frame = self.start..self.start + len;
                    self.start += len;
                    return Ok(Some(frame));
                }
                needed = len;
            }
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
                if self.buf.len() > Self::RETAINED_CAPACITY_MAX_BYTES {
                    self.buf = vec![0; Self::CAPACITY_BYTES];
                }
            }
            if self.buf.len() - self.start < needed {
                // Move the partial frame to the front, and grow for a frame larger than the buffer.
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                if self.buf.len() < needed {
                    self.buf.resize(needed, 0);
                }
            }
            let n = match stream.read(&mut self.buf[self.end..]).await {
                Ok(n) => n,
                // A TLS client that closes without close_notify, between messages, has
                // closed the connection (drivers do).
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                Err(e) => return Err(format!("read error: {e}")),
            };
            if n == 0 {
                return if self.start == self.end { Ok(None) } else { Err("truncated message: connection closed mid-frame".into()) };
            }
            self.end += n;
        }
    }
}
