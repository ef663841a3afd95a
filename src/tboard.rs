//! TensorBoard event files, written as `tensorboard --logdir` reads them: TFRecord framing
//! (length, masked CRC-32C of the length, the record, masked CRC-32C of the record) around
//! protobuf `Event` messages (`tensorflow/core/util/event.proto`, `summary.proto`). The few fields
//! used are encoded by hand: scalars as `simple_value`, text as the text plugin's string tensor,
//! images as PNG bytes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// One event file, `<dir>/events.out.tfevents.<seconds>.<host>.<pid>.<n>`; every call flushes, so
/// a run watched live shows each value as it is logged.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates the directory and a new event file in it, starting with the version record.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        // The last part tells apart files one process opens within a second, as TensorFlow's does.
        static OPENED: AtomicU64 = AtomicU64::new(0);
        let n = OPENED.fetch_add(1, Ordering::Relaxed);
        let name = format!("events.out.tfevents.{}.{}.{}.{n}", now() as u64, host.trim(), std::process::id());
        let path = dir.join(name);
        let mut this = Self { out: BufWriter::new(File::create(&path)?), path };
        let mut event = Proto::default();
        event.double(1, now()).bytes(3, b"brain.Event:2");
        this.record(&event.0)?;
        Ok(this)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A restart at `step` (a `SessionLog` START): TensorBoard drops the events earlier files
    /// hold at `step` and after, which the restarted run logs again.
    pub fn restart(&mut self, step: u64) -> std::io::Result<()> {
        let mut session = Proto::default();
        session.varint(1, 1);
        let mut event = Proto::default();
        event.double(1, now()).varint(2, step).message(7, &session);
        self.record(&event.0)
    }

    /// A scalar under `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, step: u64, value: f32) -> std::io::Result<()> {
        let mut v = Proto::default();
        v.bytes(1, tag.as_bytes()).float(2, value);
        self.summary(step, &v)
    }

    /// Text under `tag` at `step` (the text plugin renders it as markdown).
    pub fn text(&mut self, tag: &str, step: u64, text: &str) -> std::io::Result<()> {
        let mut plugin = Proto::default();
        plugin.bytes(1, b"text");
        let mut metadata = Proto::default();
        metadata.message(1, &plugin);
        // A scalar string tensor (DT_STRING = 7, no dimensions), as `tf.summary.text` writes.
        let mut tensor = Proto::default();
        tensor.varint(1, 7).message(2, &Proto::default()).bytes(8, text.as_bytes());
        let mut v = Proto::default();
        v.bytes(1, tag.as_bytes()).message(8, &tensor).message(9, &metadata);
        self.summary(step, &v)
    }

    /// A PNG image of `width` x `height` pixels under `tag` at `step`.
    pub fn image(&mut self, tag: &str, step: u64, png: &[u8], (width, height): (u32, u32)) -> std::io::Result<()> {
        let mut image = Proto::default();
        // Colorspace 3: RGB, as plotters writes.
        image.varint(1, u64::from(height)).varint(2, u64::from(width)).varint(3, 3).bytes(4, png);
        let mut v = Proto::default();
        v.bytes(1, tag.as_bytes()).message(4, &image);
        self.summary(step, &v)
    }

    /// An `Event` at `step` whose summary holds `value`.
    fn summary(&mut self, step: u64, value: &Proto) -> std::io::Result<()> {
        let mut summary = Proto::default();
        summary.message(1, value);
        let mut event = Proto::default();
        event.double(1, now()).varint(2, step).message(5, &summary);
        self.record(&event.0)
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc32c(&len).to_le_bytes())?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc32c(data).to_le_bytes())?;
        self.out.flush()
    }
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// A protobuf message being encoded: fields appended in order.
#[derive(Default)]
struct Proto(Vec<u8>);

impl Proto {
    fn key(&mut self, field: u32, wire: u8) {
        self.raw_varint(u64::from(field) << 3 | u64::from(wire));
    }

    fn raw_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn varint(&mut self, field: u32, v: u64) -> &mut Self {
        self.key(field, 0);
        self.raw_varint(v);
        self
    }

    fn double(&mut self, field: u32, v: f64) -> &mut Self {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn float(&mut self, field: u32, v: f32) -> &mut Self {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.raw_varint(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }

    fn message(&mut self, field: u32, m: &Proto) -> &mut Self {
        self.bytes(field, &m.0)
    }
}

/// CRC-32C (Castagnoli), as TFRecord uses it.
fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0x82F6_3B78 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    !data.iter().fold(!0u32, |c, &b| TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8))
}

/// TFRecord's masking, so that a CRC of data holding CRCs stays well distributed.
fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        // RFC 3720 (iSCSI), appendix B.4, and the common "123456789" check value.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
    }

    #[test]
    fn varints_and_fields_encode_as_protobuf() {
        let mut p = Proto::default();
        p.varint(1, 300).bytes(2, b"hi").float(3, 1.0);
        assert_eq!(p.0, [0x08, 0xAC, 0x02, 0x12, 2, b'h', b'i', 0x1D, 0, 0, 0x80, 0x3F]);
    }

    #[test]
    fn records_are_framed_with_their_checksums() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalar("train/loss", 3, 0.5).unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        let mut at = 0;
        for _ in 0..2 {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(len_crc, masked_crc32c(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            at += 16 + len;
        }
        assert_eq!(at, bytes.len());
    }
}
