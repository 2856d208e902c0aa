//! OP_COMPRESSED codecs (MongoDB compression spec): snappy (raw block format), zlib (zlib
//! stream, not raw deflate or gzip), zstd (standard frames) and noop.

use common::{Code, Error, Result};

/// Wire ids of the compressors, from the compression spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compressor {
    Noop = 0,
    Snappy = 1,
    Zlib = 2,
    Zstd = 3,
}

/// zlib level MongoDB uses by default (`zlibCompressionLevel` default 6).
pub const ZLIB_LEVEL: u32 = 6;
/// zstd level: the fastest, because the server's CPU is the scarce resource here.
pub const ZSTD_LEVEL: i32 = 1;

impl Compressor {
    pub const ALL: [Compressor; 4] = [Compressor::Noop, Compressor::Snappy, Compressor::Zlib, Compressor::Zstd];

    /// Names as negotiated in `hello.compression`.
    pub fn from_name(name: &str) -> Option<Compressor> {
        match name {
            "noop" => Some(Compressor::Noop),
            "snappy" => Some(Compressor::Snappy),
            "zlib" => Some(Compressor::Zlib),
            "zstd" => Some(Compressor::Zstd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compressor::Noop => "noop",
            Compressor::Snappy => "snappy",
            Compressor::Zlib => "zlib",
            Compressor::Zstd => "zstd",
        }
    }

    pub fn from_id(id: u8) -> Option<Compressor> {
        match id {
            0 => Some(Compressor::Noop),
            1 => Some(Compressor::Snappy),
            2 => Some(Compressor::Zlib),
            3 => Some(Compressor::Zstd),
            _ => None,
        }
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    /// Upper bound of the compressed size of `input_size_bytes` bytes (None: input too large).
    pub fn compressed_size_bytes_max(self, input_size_bytes: usize) -> Option<usize> {
        match self {
            Compressor::Noop => Some(input_size_bytes),
            Compressor::Snappy => match snap::raw::max_compress_len(input_size_bytes) {
                0 if input_size_bytes > 0 => None,
                n => Some(n),
            },
            // zlib worst case: stored blocks of 5 bytes overhead per 16 KiB plus header/trailer.
            Compressor::Zlib => Some(input_size_bytes + (input_size_bytes >> 12) + (input_size_bytes >> 14) + 64),
            Compressor::Zstd => Some(zstd::zstd_safe::compress_bound(input_size_bytes)),
        }
    }
}

fn corrupt() -> Error {
    Error::new(Code::BadValue, "Compressed message was invalid or corrupted")
}

fn size_mismatch() -> Error {
    Error::new(Code::BadValue, "Decompressing message returned less data than expected")
}

/// Compress `data` into a new buffer.
pub fn compress(c: Compressor, data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    compress_append(c, data, &mut out)?;
    Ok(out)
}

/// Compress `data`, appending to `out` (so a frame header can precede it without a copy).
pub(crate) fn compress_append(c: Compressor, data: &[u8], out: &mut Vec<u8>) -> Result<()> {
    let start = out.len();
    let bound = c.compressed_size_bytes_max(data.len()).ok_or_else(|| Error::new(Code::BadValue, "input too large to compress"))?;
    match c {
        Compressor::Noop => out.extend_from_slice(data),
        Compressor::Snappy => {
            out.resize(start + bound, 0);
            let n = snap::raw::Encoder::new().compress(data, &mut out[start..]).map_err(|e| Error::internal(format!("snappy compression failed: {e}")))?;
            out.truncate(start + n);
        }
        Compressor::Zlib => {
            use std::io::Write;
            out.reserve(bound);
            let mut encoder = flate2::write::ZlibEncoder::new(&mut *out, flate2::Compression::new(ZLIB_LEVEL));
            encoder.write_all(data).and_then(|_| encoder.finish().map(|_| ())).map_err(|e| Error::internal(format!("zlib compression failed: {e}")))?;
        }
        Compressor::Zstd => {
            out.resize(start + bound, 0);
            let n =
                zstd::bulk::compress_to_buffer(data, &mut out[start..], ZSTD_LEVEL).map_err(|e| Error::internal(format!("zstd compression failed: {e}")))?;
            out.truncate(start + n);
        }
    }
    Ok(())
}

/// Decompress `data`, which must expand to exactly `uncompressed_size_bytes`. The caller bounds
/// `uncompressed_size_bytes`; no codec ever writes more than that (decompression bombs).
pub fn decompress(c: Compressor, data: &[u8], uncompressed_size_bytes: usize) -> Result<Vec<u8>> {
    // Zeroed allocation is lazily committed by the OS, so a lying size costs little until filled.
    let mut out = vec![0u8; uncompressed_size_bytes];
    decompress_into(c, data, &mut out)?;
    Ok(out)
}

/// Decompress `data` into exactly `out.len()` bytes; any other decompressed size is an error.
pub(crate) fn decompress_into(c: Compressor, data: &[u8], out: &mut [u8]) -> Result<()> {
    match c {
        Compressor::Noop => {
            if data.len() != out.len() {
                return Err(size_mismatch());
            }
            out.copy_from_slice(data);
        }
        Compressor::Snappy => {
            // The raw format states its length up front: check it before doing any work.
            let claimed = snap::raw::decompress_len(data).map_err(|_| corrupt())?;
            if claimed != out.len() {
                return Err(size_mismatch());
            }
            let n = snap::raw::Decoder::new().decompress(data, out).map_err(|_| corrupt())?;
            if n != out.len() {
                return Err(size_mismatch());
            }
        }
        Compressor::Zlib => {
            use flate2::{Decompress, FlushDecompress, Status};
            let mut d = Decompress::new(true);
            loop {
                let in_pos = usize::try_from(d.total_in()).map_err(|_| corrupt())?;
                let out_pos = usize::try_from(d.total_out()).map_err(|_| corrupt())?;
                let input = data.get(in_pos..).ok_or_else(corrupt)?;
                let output = out.get_mut(out_pos..).ok_or_else(corrupt)?;
                let status = d.decompress(input, output, FlushDecompress::None).map_err(|_| corrupt())?;
                if status == Status::StreamEnd {
                    break;
                }
                if d.total_in() as usize == in_pos && d.total_out() as usize == out_pos {
                    // No progress: input ran out early or output is full with more to come.
                    return Err(if out_pos == out.len() { corrupt() } else { size_mismatch() });
                }
            }
            if d.total_out() as usize != out.len() || d.total_in() as usize != data.len() {
                return Err(size_mismatch());
            }
        }
        Compressor::Zstd => {
            let n = zstd::bulk::decompress_to_buffer(data, out).map_err(|_| corrupt())?;
            if n != out.len() {
                return Err(size_mismatch());
            }
        }
    }
    Ok(())
}

/// Commands whose replies (and requests) must never be compressed (compression spec).
pub fn is_compressible_command(name: &str) -> bool {
    const UNCOMPRESSIBLE: [&str; 12] = [
        "hello",
        "isMaster",
        "ismaster",
        "saslStart",
        "saslContinue",
        "getnonce",
        "authenticate",
        "createUser",
        "updateUser",
        "copydbSaslStart",
        "copydbgetnonce",
        "copydb",
    ];
    !UNCOMPRESSIBLE.contains(&name)
}
