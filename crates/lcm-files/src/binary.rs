//! Images and other binary payloads: the format by its magic bytes, image dimensions from the
//! header, a zip archive's entry names from its central directory, the size, the first bytes.

use crate::summary::{DETAIL, KEY, MINOR, Summary};
use crate::util::{bytes as size, count, countu, hex_head, truncate};

/// A format recognised by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Magic {
    Png,
    Jpeg,
    Gif,
    WebP,
    Bmp,
    Ico,
    Tiff,
    Pdf,
    Sqlite,
    Zip,
    Gzip,
    Bzip2,
    Xz,
    Zstd,
    SevenZip,
    Rar,
    Tar,
    Elf,
    MachO,
    Pe,
    Wasm,
    Parquet,
    Ogg,
    Mp3,
    Mp4,
    Wav,
    Class,
}

impl Magic {
    /// MIME type of the format.
    pub(crate) fn mime(self) -> &'static str {
        use Magic::*;
        match self {
            Png => "image/png",
            Jpeg => "image/jpeg",
            Gif => "image/gif",
            WebP => "image/webp",
            Bmp => "image/bmp",
            Ico => "image/x-icon",
            Tiff => "image/tiff",
            Pdf => "application/pdf",
            Sqlite => "application/vnd.sqlite3",
            Zip => "application/zip",
            Gzip => "application/gzip",
            Bzip2 => "application/x-bzip2",
            Xz => "application/x-xz",
            Zstd => "application/zstd",
            SevenZip => "application/x-7z-compressed",
            Rar => "application/vnd.rar",
            Tar => "application/x-tar",
            Elf => "application/x-elf",
            MachO => "application/x-mach-binary",
            Pe => "application/vnd.microsoft.portable-executable",
            Wasm => "application/wasm",
            Parquet => "application/vnd.apache.parquet",
            Ogg => "audio/ogg",
            Mp3 => "audio/mpeg",
            Mp4 => "video/mp4",
            Wav => "audio/wav",
            Class => "application/java-vm",
        }
    }

    /// A short name for the summary.
    pub(crate) fn name(self) -> &'static str {
        use Magic::*;
        match self {
            Png => "PNG",
            Jpeg => "JPEG",
            Gif => "GIF",
            WebP => "WebP",
            Bmp => "BMP",
            Ico => "ICO",
            Tiff => "TIFF",
            Pdf => "PDF document",
            Sqlite => "SQLite database",
            Zip => "zip archive",
            Gzip => "gzip stream",
            Bzip2 => "bzip2 stream",
            Xz => "xz stream",
            Zstd => "zstd stream",
            SevenZip => "7z archive",
            Rar => "RAR archive",
            Tar => "tar archive",
            Elf => "ELF executable",
            MachO => "Mach-O executable",
            Pe => "PE executable (Windows)",
            Wasm => "WebAssembly module",
            Parquet => "Parquet file",
            Ogg => "Ogg media",
            Mp3 => "MP3 audio",
            Mp4 => "MP4/QuickTime media",
            Wav => "WAV audio",
            Class => "Java class file",
        }
    }

    /// An image format.
    pub(crate) fn is_image(self) -> bool {
        use Magic::*;
        matches!(self, Png | Jpeg | Gif | WebP | Bmp | Ico | Tiff)
    }

    /// A signature that text can start with (printable ASCII, or checked at an offset): it
    /// counts only when the content is not text.
    pub(crate) fn weak(self) -> bool {
        use Magic::*;
        matches!(
            self,
            Gif | Bmp | WebP | Wav | Bzip2 | Rar | Tar | Pe | Parquet | Ogg | Mp3 | Mp4
        )
    }
}

/// The format of `b` by its first bytes.
pub(crate) fn magic(b: &[u8]) -> Option<Magic> {
    use Magic::*;
    let starts = |m: &[u8]| b.starts_with(m);
    Some(if starts(b"\x89PNG\r\n\x1a\n") {
        Png
    } else if starts(b"\xff\xd8\xff") {
        Jpeg
    } else if starts(b"GIF87a") || starts(b"GIF89a") {
        Gif
    } else if starts(b"RIFF") && b.get(8..12) == Some(b"WEBP") {
        WebP
    } else if starts(b"RIFF") && b.get(8..12) == Some(b"WAVE") {
        Wav
    } else if starts(b"BM") && b.len() >= 26 && b.get(6..10) == Some(&[0, 0, 0, 0]) {
        Bmp
    } else if starts(b"\0\0\x01\0") && b.len() >= 6 {
        Ico
    } else if starts(b"II*\0") || starts(b"MM\0*") {
        Tiff
    } else if starts(b"%PDF-") {
        Pdf
    } else if starts(b"SQLite format 3\0") {
        Sqlite
    } else if starts(b"PK\x03\x04") || starts(b"PK\x05\x06") {
        Zip
    } else if starts(b"\x1f\x8b") {
        Gzip
    } else if starts(b"BZh") && b.len() > 3 && b[3].is_ascii_digit() {
        Bzip2
    } else if starts(b"\xfd7zXZ\0") {
        Xz
    } else if starts(b"\x28\xb5\x2f\xfd") {
        Zstd
    } else if starts(b"7z\xbc\xaf\x27\x1c") {
        SevenZip
    } else if starts(b"Rar!\x1a\x07") {
        Rar
    } else if b.get(257..262) == Some(b"ustar") {
        Tar
    } else if starts(b"\x7fELF") {
        Elf
    } else if starts(b"\xfe\xed\xfa\xce")
        || starts(b"\xfe\xed\xfa\xcf")
        || starts(b"\xce\xfa\xed\xfe")
        || starts(b"\xcf\xfa\xed\xfe")
    {
        MachO
    } else if starts(b"MZ") && b.len() >= 64 {
        Pe
    } else if starts(b"\0asm") {
        Wasm
    } else if starts(b"PAR1") {
        Parquet
    } else if starts(b"OggS") {
        Ogg
    } else if starts(b"ID3") {
        Mp3
    } else if b.get(4..8) == Some(b"ftyp") {
        Mp4
    } else if starts(b"\xca\xfe\xba\xbe") {
        Class
    } else {
        return None;
    })
}

fn be16(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 2)?;
    Some(u32::from(u16::from_be_bytes([s[0], s[1]])))
}

fn le16(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 2)?;
    Some(u32::from(u16::from_le_bytes([s[0], s[1]])))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 4)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 4)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn le24(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 3)?;
    Some(u32::from(s[0]) | u32::from(s[1]) << 8 | u32::from(s[2]) << 16)
}

/// Width and height from an image header, plus a detail ("8-bit RGBA").
pub(crate) fn image_info(m: Magic, b: &[u8]) -> Option<(u32, u32, Option<String>)> {
    match m {
        Magic::Png => {
            if b.get(12..16) != Some(b"IHDR") {
                return None;
            }
            let w = be32(b, 16)?;
            let h = be32(b, 20)?;
            let depth = *b.get(24)?;
            let color = match b.get(25)? {
                0 => "grayscale",
                2 => "RGB",
                3 => "indexed",
                4 => "grayscale+alpha",
                6 => "RGBA",
                _ => "unknown color type",
            };
            Some((w, h, Some(format!("{depth}-bit {color}"))))
        }
        Magic::Gif => Some((le16(b, 6)?, le16(b, 8)?, None)),
        Magic::Bmp => {
            let w = le32(b, 18)? as i32;
            let h = le32(b, 22)? as i32;
            Some((w.unsigned_abs(), h.unsigned_abs(), None))
        }
        Magic::WebP => match b.get(12..16)? {
            b"VP8 " => {
                // Frame header: 3 bytes tag, 3 bytes start code, then 14-bit width and height.
                let w = le16(b, 26)? & 0x3fff;
                let h = le16(b, 28)? & 0x3fff;
                Some((w, h, Some("lossy".into())))
            }
            b"VP8L" => {
                let bits = le32(b, 21)?;
                Some((
                    (bits & 0x3fff) + 1,
                    ((bits >> 14) & 0x3fff) + 1,
                    Some("lossless".into()),
                ))
            }
            b"VP8X" => Some((le24(b, 24)? + 1, le24(b, 27)? + 1, Some("extended".into()))),
            _ => None,
        },
        Magic::Jpeg => jpeg_size(b),
        Magic::Ico => {
            let n = le16(b, 4)?;
            let w = u32::from(*b.get(6)?);
            let h = u32::from(*b.get(7)?);
            Some((
                if w == 0 { 256 } else { w },
                if h == 0 { 256 } else { h },
                Some(format!("{n} image{}", crate::util::plural(u64::from(n)))),
            ))
        }
        _ => None,
    }
}

/// Dimensions from a JPEG's first start-of-frame marker.
fn jpeg_size(b: &[u8]) -> Option<(u32, u32, Option<String>)> {
    let mut i = 2;
    // Markers are few; each step moves forward by at least 2 bytes.
    while i + 4 <= b.len() {
        if b[i] != 0xff {
            return None;
        }
        let marker = b[i + 1];
        if marker == 0xff {
            i += 1;
            continue;
        }
        if marker == 0xd8 || marker == 0x01 || (0xd0..=0xd7).contains(&marker) {
            i += 2;
            continue;
        }
        let len = be16(b, i + 2)? as usize;
        let is_sof = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
        if is_sof {
            let h = be16(b, i + 5)?;
            let w = be16(b, i + 7)?;
            let progressive = matches!(marker, 0xc2 | 0xc6 | 0xca | 0xce);
            return Some((w, h, progressive.then(|| "progressive".to_string())));
        }
        if len < 2 {
            return None;
        }
        i += 2 + len;
    }
    None
}

/// The summary of an image.
pub(crate) fn explore_image(b: &[u8]) -> Summary {
    let Some(m) = magic(b).filter(|m| m.is_image()) else {
        return explore_binary(b);
    };
    let mut s = match image_info(m, b) {
        Some((w, h, detail)) => Summary::new(format!(
            "Image: {} {w}×{h}{}, {}",
            m.name(),
            detail.map(|d| format!(" ({d})")).unwrap_or_default(),
            size(b.len())
        )),
        None => Summary::new(format!(
            "Image: {}, dimensions not in the header, {}",
            m.name(),
            size(b.len())
        )),
    };
    s.push(MINOR, format!("First bytes: {}", hex_head(b, 16)));
    s
}

/// The summary of a binary payload.
pub(crate) fn explore_binary(b: &[u8]) -> Summary {
    let m = magic(b);
    let what = m.map_or("unrecognised binary data", Magic::name);
    let mut s = Summary::new(format!("Binary: {what}, {}", size(b.len())));
    match m {
        Some(Magic::Zip) => zip_entries(b, &mut s),
        Some(Magic::Gzip) => gzip_info(b, &mut s),
        Some(Magic::Pdf) => {
            let version: String = b
                .get(5..8)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            s.push(KEY, format!("PDF version {version}"));
        }
        Some(Magic::Elf) => {
            let class = match b.get(4) {
                Some(1) => "32-bit",
                Some(2) => "64-bit",
                _ => "unknown class",
            };
            s.push(KEY, format!("ELF {class}"));
        }
        _ => {}
    }
    if m.is_none() {
        let printable = b
            .iter()
            .take(4096)
            .filter(|&&c| c == b'\n' || c == b'\t' || (0x20..0x7f).contains(&c))
            .count();
        let sampled = b.len().min(4096);
        if sampled > 0 {
            s.push(
                DETAIL,
                format!(
                    "Printable ASCII in the first {}: {}%",
                    size(sampled),
                    printable * 100 / sampled
                ),
            );
        }
    }
    s.push(KEY, format!("First bytes: {}", hex_head(b, 32)));
    s
}

/// The entry names of a zip archive, from the end-of-central-directory record.
fn zip_entries(b: &[u8], s: &mut Summary) {
    // The EOCD record is in the last 22 + 65,535 bytes.
    let start = b.len().saturating_sub(22 + 65_535);
    let Some(eocd) = (start..b.len().saturating_sub(21))
        .rev()
        .find(|&i| b.get(i..i + 4) == Some(b"PK\x05\x06"))
    else {
        s.push(KEY, "No zip central directory found (truncated archive?)");
        return;
    };
    let total = le16(b, eocd + 10).unwrap_or(0);
    let offset = le32(b, eocd + 16).unwrap_or(0) as usize;
    s.push(
        KEY,
        format!(
            "{} entr{}",
            count(u64::from(total)),
            if total == 1 { "y" } else { "ies" }
        ),
    );
    s.heading(DETAIL, "Entries:");
    let mut at = offset;
    let mut shown = 0usize;
    while shown < 40 && b.get(at..at + 4) == Some(b"PK\x01\x02") {
        let (Some(csize), Some(usize_), Some(nlen), Some(elen), Some(clen)) = (
            le32(b, at + 20),
            le32(b, at + 24),
            le16(b, at + 28),
            le16(b, at + 30),
            le16(b, at + 32),
        ) else {
            break;
        };
        let Some(name) = b.get(at + 46..at + 46 + nlen as usize) else {
            break;
        };
        s.push(
            DETAIL,
            format!(
                "  {} ({}, {} compressed)",
                truncate(&String::from_utf8_lossy(name), 120),
                size(usize_ as usize),
                size(csize as usize)
            ),
        );
        shown += 1;
        at += 46 + nlen as usize + elen as usize + clen as usize;
    }
    if (shown as u32) < total {
        s.push(
            DETAIL,
            format!("  … {} more", countu(total as usize - shown)),
        );
    }
}

/// A gzip member's original name (when stored) and uncompressed size (mod 4 GiB).
fn gzip_info(b: &[u8], s: &mut Summary) {
    let flags = b.get(3).copied().unwrap_or(0);
    if flags & 0x08 != 0 {
        let mut at = 10usize;
        if flags & 0x04 != 0 {
            at += 2 + le16(b, 10).unwrap_or(0) as usize;
        }
        if let Some(rest) = b.get(at..) {
            let end = rest.iter().take(1024).position(|&c| c == 0).unwrap_or(0);
            if end > 0 {
                s.push(
                    KEY,
                    format!(
                        "Original name: {}",
                        truncate(&String::from_utf8_lossy(&rest[..end]), 200)
                    ),
                );
            }
        }
    }
    if b.len() >= 18
        && let Some(isize_) = le32(b, b.len() - 4)
    {
        s.push(
            KEY,
            format!(
                "Uncompressed size (from the trailer, mod 4 GiB): {}",
                size(isize_ as usize)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut v = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        v.extend_from_slice(&w.to_be_bytes());
        v.extend_from_slice(&h.to_be_bytes());
        v.extend_from_slice(&[8, 6, 0, 0, 0]);
        v
    }

    #[test]
    fn png_dimensions() {
        let s = explore_image(&png(640, 480));
        assert!(
            s.head().contains("PNG 640×480 (8-bit RGBA)"),
            "{}",
            s.head()
        );
    }

    #[test]
    fn gif_bmp_jpeg_webp_dimensions() {
        let gif = b"GIF89a\x20\x03\x58\x02\0\0\0";
        assert_eq!(
            image_info(Magic::Gif, gif).map(|i| (i.0, i.1)),
            Some((800, 600))
        );
        let mut bmp = b"BM\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0".to_vec();
        bmp.extend_from_slice(&100i32.to_le_bytes());
        bmp.extend_from_slice(&(-50i32).to_le_bytes());
        assert_eq!(magic(&bmp), Some(Magic::Bmp));
        assert_eq!(
            image_info(Magic::Bmp, &bmp).map(|i| (i.0, i.1)),
            Some((100, 50))
        );
        // SOI, APP0 (length 16), SOF0 with 1080×1920.
        let mut jpg = vec![0xff, 0xd8, 0xff, 0xe0, 0, 16];
        jpg.extend_from_slice(&[0; 14]);
        jpg.extend_from_slice(&[0xff, 0xc0, 0, 17, 8, 0x07, 0x80, 0x04, 0x38, 3]);
        assert_eq!(
            image_info(Magic::Jpeg, &jpg).map(|i| (i.0, i.1)),
            Some((1080, 1920))
        );
        let mut webp = b"RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0".to_vec();
        webp.extend_from_slice(&[0x1f, 0x03, 0x00, 0x57, 0x02, 0x00]); // 800×600
        assert_eq!(
            image_info(Magic::WebP, &webp).map(|i| (i.0, i.1)),
            Some((800, 600))
        );
    }

    #[test]
    fn truncated_headers_do_not_panic() {
        for m in [
            Magic::Png,
            Magic::Jpeg,
            Magic::Gif,
            Magic::WebP,
            Magic::Bmp,
            Magic::Ico,
        ] {
            for len in 0..40 {
                let b = vec![0xffu8; len];
                let _ = image_info(m, &b);
            }
        }
        let _ = explore_image(b"\x89PNG\r\n\x1a\n");
        let _ = explore_binary(b"PK\x03\x04");
        let _ = explore_binary(b"\x1f\x8b\x08\x08");
    }

    #[test]
    fn binary_shows_type_size_and_hex() {
        let s = explore_binary(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
        assert_eq!(s.head(), "Binary: unrecognised binary data, 7 bytes");
        assert!(s.text().contains("de ad be ef 01 02 03"), "{}", s.text());
    }

    #[test]
    fn zip_lists_entries() {
        // One stored entry "a.txt" containing "hi", built by hand.
        let mut z = Vec::new();
        z.extend_from_slice(b"PK\x03\x04");
        z.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        z.extend_from_slice(&[0, 0, 0, 0]); // crc
        z.extend_from_slice(&2u32.to_le_bytes());
        z.extend_from_slice(&2u32.to_le_bytes());
        z.extend_from_slice(&5u16.to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z.extend_from_slice(b"a.txthi");
        let cd = z.len() as u32;
        z.extend_from_slice(b"PK\x01\x02");
        z.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        z.extend_from_slice(&[0, 0, 0, 0]); // crc
        z.extend_from_slice(&2u32.to_le_bytes());
        z.extend_from_slice(&2u32.to_le_bytes());
        z.extend_from_slice(&5u16.to_le_bytes());
        z.extend_from_slice(&[0; 12]);
        z.extend_from_slice(&0u32.to_le_bytes());
        z.extend_from_slice(b"a.txt");
        let cd_len = z.len() as u32 - cd;
        z.extend_from_slice(b"PK\x05\x06\0\0\0\0\x01\0\x01\0");
        z.extend_from_slice(&cd_len.to_le_bytes());
        z.extend_from_slice(&cd.to_le_bytes());
        z.extend_from_slice(&[0, 0]);
        let s = explore_binary(&z);
        assert!(s.head().contains("zip archive"));
        assert!(s.text().contains("1 entry"), "{}", s.text());
        assert!(s.text().contains("a.txt (2 bytes"), "{}", s.text());
    }
}
