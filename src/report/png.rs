//! A small PNG encoder for the plots' RGB buffers (PNG spec, RFC 2083; zlib, RFC 1950; deflate,
//! RFC 1951).
//!
//! plotters' own file output picks the encoder from the file extension, so it cannot write the
//! `<name>.png.tmp` file that is renamed into place. Instead the plots are drawn into a memory
//! buffer and encoded here: each row gets the PNG filter with the smallest sum of absolute
//! residuals, and the filtered bytes go through a single fixed-Huffman deflate block whose only
//! matches are runs (distance 1). Charts are mostly flat colour, so this lands within a few times
//! of zlib's size at a fraction of the code.

/// Encodes an 8-bit RGB image (`rgb.len() == width * height * 3`, rows top to bottom) as PNG.
///
/// # Panics
///
/// If `rgb.len()` is not `width * height * 3`; callers allocate the buffer from the same sizes.
pub(crate) fn encode_rgb(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    let stride = width as usize * 3;
    assert_eq!(
        rgb.len(),
        stride * height as usize,
        "RGB buffer size must match the image size"
    );

    let filtered = filter_rows(rgb, stride);
    let mut zlib = vec![0x78, 0x01]; // CMF: deflate with a 32 KiB window; FLG: no dict, check bits.
    zlib.extend(deflate_runs(&filtered));
    zlib.extend(adler32(&filtered).to_be_bytes());

    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend(width.to_be_bytes());
    ihdr.extend(height.to_be_bytes());
    // Bit depth 8, colour type 2 (RGB), deflate, adaptive filtering, no interlace.
    ihdr.extend([8, 2, 0, 0, 0]);

    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    write_chunk(&mut png, b"IHDR", &ihdr);
    write_chunk(&mut png, b"IDAT", &zlib);
    write_chunk(&mut png, b"IEND", &[]);
    png
}

fn write_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    // Chunk lengths are u32; the largest plot (2000×1200 RGB) is far below 4 GiB.
    out.extend((data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend(kind);
    out.extend(data);
    let crc = crc32(&out[start..]);
    out.extend(crc.to_be_bytes());
}

/// Prefixes each row with its filter type byte and filters it (None, Sub, Up or Paeth, whichever
/// has the smallest sum of residuals read as signed bytes).
fn filter_rows(rgb: &[u8], stride: usize) -> Vec<u8> {
    const BPP: usize = 3;
    let zero_row = vec![0u8; stride];
    let mut out = Vec::with_capacity(rgb.len() + rgb.len() / stride.max(1));
    let mut candidate = vec![0u8; stride];
    let mut best = vec![0u8; stride];
    for (y, row) in rgb.chunks_exact(stride).enumerate() {
        let up = if y == 0 {
            &zero_row[..]
        } else {
            &rgb[(y - 1) * stride..y * stride]
        };
        let mut best_kind = 0u8;
        let mut best_cost = u64::MAX;
        for kind in 0..=4u8 {
            if kind == 3 {
                continue; // Average rarely wins on flat-colour charts.
            }
            for i in 0..stride {
                let a = if i >= BPP { row[i - BPP] } else { 0 };
                let b = up[i];
                let c = if i >= BPP { up[i - BPP] } else { 0 };
                let predicted = match kind {
                    0 => 0,
                    1 => a,
                    2 => b,
                    _ => paeth(a, b, c),
                };
                candidate[i] = row[i].wrapping_sub(predicted);
            }
            let cost = candidate
                .iter()
                .map(|&v| u64::from((v as i8).unsigned_abs()))
                .sum();
            if cost < best_cost {
                best_cost = cost;
                best_kind = kind;
                best.copy_from_slice(&candidate);
            }
        }
        out.push(best_kind);
        out.extend_from_slice(&best);
    }
    out
}

fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let p = i16::from(a) + i16::from(b) - i16::from(c);
    let (pa, pb, pc) = (
        (p - i16::from(a)).abs(),
        (p - i16::from(b)).abs(),
        (p - i16::from(c)).abs(),
    );
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

/// Deflate bit writer: bits go out least significant first (RFC 1951 §3.1.1).
struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter {
    fn put(&mut self, value: u32, bits: u32) {
        self.acc |= u64::from(value) << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code, which deflate stores most significant bit first.
    fn put_code(&mut self, code: u32, bits: u32) {
        self.put(code.reverse_bits() >> (32 - bits), bits);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// Writes literal/length symbol `sym` with the fixed Huffman code (RFC 1951 §3.2.6).
fn put_litlen(w: &mut BitWriter, sym: u32) {
    match sym {
        0..=143 => w.put_code(0x30 + sym, 8),
        144..=255 => w.put_code(0x190 + sym - 144, 9),
        256..=279 => w.put_code(sym - 256, 7),
        _ => w.put_code(0xC0 + sym - 280, 8),
    }
}

/// Base match length of length codes 257..=285 and their extra bits (RFC 1951 §3.2.5).
const LENGTH_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LENGTH_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];

/// One final fixed-Huffman block; runs of the previous byte become (length, distance 1) matches.
fn deflate_runs(data: &[u8]) -> Vec<u8> {
    const MIN_MATCH: usize = 3;
    const MAX_MATCH: usize = 258;
    let mut w = BitWriter {
        out: Vec::with_capacity(data.len() / 8),
        acc: 0,
        n: 0,
    };
    w.put(1, 1); // BFINAL
    w.put(1, 2); // BTYPE = 01, fixed Huffman codes
    let mut i = 0;
    while i < data.len() {
        let run = if i == 0 {
            0
        } else {
            let prev = data[i - 1];
            data[i..]
                .iter()
                .take(MAX_MATCH)
                .take_while(|&&b| b == prev)
                .count()
        };
        if run >= MIN_MATCH {
            // Largest base <= run; 258 maps to code 285 as the RFC requires.
            let idx = LENGTH_BASE
                .iter()
                .rposition(|&b| usize::from(b) <= run)
                .unwrap_or(0);
            put_litlen(&mut w, 257 + idx as u32);
            let extra = u32::from(LENGTH_EXTRA[idx]);
            if extra > 0 {
                w.put((run - usize::from(LENGTH_BASE[idx])) as u32, extra);
            }
            w.put_code(0, 5); // distance code 0 = distance 1
            i += run;
        } else {
            put_litlen(&mut w, u32::from(data[i]));
            i += 1;
        }
    }
    put_litlen(&mut w, 256); // end of block
    w.finish()
}

fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65521;
    let (mut a, mut b) = (1u32, 0u32);
    // 5552 bytes is the longest stretch before `b` could overflow u32 (zlib's NMAX).
    for chunk in data.chunks(5552) {
        for &byte in chunk {
            a += u32::from(byte);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_reference_values() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    /// Inflates a fixed-Huffman block with distance-1 matches only (what `deflate_runs` writes).
    fn inflate_runs(bytes: &[u8]) -> Vec<u8> {
        let mut pos = 0usize;
        let mut bit = |n: u32| -> u32 {
            let mut v = 0;
            for k in 0..n {
                let b = (bytes[pos / 8] >> (pos % 8)) & 1;
                v |= u32::from(b) << k;
                pos += 1;
            }
            v
        };
        assert_eq!(bit(1), 1);
        assert_eq!(bit(2), 1);
        let mut out: Vec<u8> = Vec::new();
        loop {
            // Read a Huffman code MSB first, 7 bits then more as needed.
            let mut code = 0u32;
            for _ in 0..7 {
                code = (code << 1) | bit(1);
            }
            let sym = if code <= 0x17 {
                256 + code
            } else {
                code = (code << 1) | bit(1);
                if (0x30..=0xBF).contains(&code) {
                    code - 0x30
                } else if (0xC0..=0xC7).contains(&code) {
                    280 + code - 0xC0
                } else {
                    code = (code << 1) | bit(1);
                    144 + code - 0x190
                }
            };
            match sym {
                0..=255 => out.push(sym as u8),
                256 => return out,
                _ => {
                    let idx = (sym - 257) as usize;
                    let len = u32::from(LENGTH_BASE[idx]) + bit(u32::from(LENGTH_EXTRA[idx]));
                    assert_eq!(bit(5), 0, "only distance 1 is written");
                    let last = *out.last().unwrap();
                    out.extend(std::iter::repeat_n(last, len as usize));
                }
            }
        }
    }

    #[test]
    fn deflate_round_trips_runs_and_literals() {
        let mut data: Vec<u8> = (0..=255).collect();
        for len in [1, 2, 3, 4, 10, 11, 130, 257, 258, 259, 600] {
            data.extend(std::iter::repeat_n((len % 251) as u8, len));
            data.push(200);
        }
        assert_eq!(inflate_runs(&deflate_runs(&data)), data);
    }

    #[test]
    fn png_has_signature_ihdr_and_filtered_rows() {
        let (w, h) = (5u32, 4u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 256) as u8).collect();
        let png = encode_rgb(w, h, &rgb);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), w);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), h);
        assert!(png.ends_with(&[0, 0, 0, 0, b'I', b'E', b'N', b'D', 0xAE, 0x42, 0x60, 0x82]));

        // Undo the filters and compare with the input.
        let idat_len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        let zlib = &png[41..41 + idat_len];
        let filtered = inflate_runs(&zlib[2..]);
        let stride = (w * 3) as usize;
        let mut prev = vec![0u8; stride];
        let mut decoded = Vec::new();
        for row in filtered.chunks_exact(stride + 1) {
            let mut cur = vec![0u8; stride];
            for i in 0..stride {
                let a = if i >= 3 { cur[i - 3] } else { 0 };
                let c = if i >= 3 { prev[i - 3] } else { 0 };
                let pred = match row[0] {
                    0 => 0,
                    1 => a,
                    2 => prev[i],
                    4 => paeth(a, prev[i], c),
                    k => panic!("unexpected filter {k}"),
                };
                cur[i] = row[1 + i].wrapping_add(pred);
            }
            decoded.extend_from_slice(&cur);
            prev = cur;
        }
        assert_eq!(decoded, rgb);
    }
}
