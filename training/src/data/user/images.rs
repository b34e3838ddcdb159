//! Image folders in torchvision's `ImageFolder` layout: `root/CLASS/*.png|jpg|jpeg`, the class
//! index of a folder its position among the sorted class folder names; for a natural split
//! `root/CLIENT/CLASS/…`, the classes the sorted union of every client's class folders.
//!
//! PNG is decoded by `png` (palette and 16-bit samples reduced to 8 bits), JPEG by
//! `zune-jpeg`. Grayscale images give one channel, colour images three (an alpha channel is
//! dropped); every image of a dataset must have the first one's channels, height and width.
//! A row is the image channels-first (`C × H × W`, as the CIFAR loader and the CNNs read it),
//! each sample `/ 255` in `[0, 1]`. Files are read one at a time: memory is the features
//! (4 bytes per value) and one decoded image.

use std::path::{Path, PathBuf};

use super::Rows;
use crate::data::files::FileError;

/// Reads the image folder `root`; `known` are the training folder's class names when reading a
/// test folder (a class folder not among them is an error).
pub fn load_folder(
    root: &Path,
    known: Option<&[String]>,
    natural_split: bool,
) -> Result<Rows, FileError> {
    let groups: Vec<(Option<String>, PathBuf)> = match natural_split {
        true => subfolders(root)?
            .into_iter()
            .map(|name| (Some(name.clone()), root.join(name)))
            .collect(),
        false => vec![(None, root.to_path_buf())],
    };
    let mut names: Vec<String> = Vec::new();
    for (_, dir) in &groups {
        names.extend(subfolders(dir)?);
    }
    names.sort();
    names.dedup();
    if names.is_empty() {
        let layout = match natural_split {
            true => "root/CLIENT/CLASS/*.png|jpg",
            false => "root/CLASS/*.png|jpg",
        };
        return Err(FileError::MissingPart {
            path: root.to_path_buf(),
            what: "class folder",
            name: "CLASS".into(),
            expected: layout,
            found: Vec::new(),
        });
    }
    let class_names = match known {
        Some(known) => {
            if let Some(stray) = names.iter().find(|n| !known.contains(n)) {
                return Err(FileError::Shape {
                    path: root.join(stray),
                    part: "class folder".into(),
                    expected: format!("one of the training classes {known:?}"),
                    found: format!("{stray:?}"),
                });
            }
            known.to_vec()
        }
        None => names,
    };
    let mut rows = Rows {
        features: Vec::new(),
        shape: Vec::new(),
        labels: Vec::new(),
        clients: natural_split.then(Vec::new),
        class_names: Some(class_names.clone()),
    };
    for (client, dir) in &groups {
        for (label, class) in class_names.iter().enumerate() {
            let class_dir = dir.join(class);
            if !class_dir.is_dir() {
                continue;
            }
            for file in image_files(&class_dir)? {
                let (shape, pixels) = decode(&file)?;
                if rows.shape.is_empty() {
                    rows.shape = shape;
                } else if rows.shape != shape {
                    return Err(FileError::Shape {
                        path: file,
                        part: "image".into(),
                        expected: format!(
                            "channels × height × width {:?}, as the first image",
                            rows.shape
                        ),
                        found: format!("{shape:?}"),
                    });
                }
                rows.features.extend(pixels);
                rows.labels.push(label as i64);
                if let (Some(ids), Some(client)) = (rows.clients.as_mut(), client) {
                    ids.push(client.clone());
                }
            }
        }
    }
    if rows.shape.is_empty() {
        rows.shape = vec![0];
    }
    Ok(rows)
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> FileError + '_ {
    move |cause| FileError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// The names of the folders in `dir`, sorted (hidden ones skipped).
fn subfolders(dir: &Path) -> Result<Vec<String>, FileError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() && !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The PNG and JPEG files of `dir` by extension, sorted by name; other files are ignored.
fn image_files(dir: &Path) -> Result<Vec<PathBuf>, FileError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        let image = (path.extension().and_then(|e| e.to_str()))
            .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"));
        if image && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The image at `path` as `[C, H, W]` and its channels-first samples in `[0, 1]`.
fn decode(path: &Path) -> Result<(Vec<usize>, Vec<f32>), FileError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    let is_png = bytes.starts_with(b"\x89PNG");
    let (width, height, channels, interleaved) = match is_png {
        true => decode_png(&bytes).map_err(|cause| FileError::Image {
            path: path.to_path_buf(),
            format: "PNG",
            cause,
        })?,
        false => decode_jpeg(&bytes).map_err(|cause| FileError::Image {
            path: path.to_path_buf(),
            format: "JPEG",
            cause,
        })?,
    };
    // Keep gray or the three colour channels; an alpha channel (2 or 4) is dropped.
    let kept = if channels >= 3 { 3 } else { 1 };
    let plane = width * height;
    let mut pixels = vec![0.0f32; kept * plane];
    for (at, pixel) in interleaved.chunks_exact(channels).take(plane).enumerate() {
        for c in 0..kept {
            pixels[c * plane + at] = f32::from(pixel[c]) / 255.0;
        }
    }
    Ok((vec![kept, height, width], pixels))
}

/// The most pixels an image of a dataset may have (4096 × 4096): a training sample is far
/// smaller, and a damaged or hostile header must not make the decoder allocate gigabytes.
const MAX_PIXELS: usize = 4096 * 4096;

/// Refuses a header whose image would exceed [`MAX_PIXELS`], before anything is decoded.
fn check_size(width: usize, height: usize) -> Result<(), String> {
    if width.saturating_mul(height) > MAX_PIXELS {
        return Err(format!(
            "{width} × {height} pixels, more than the {MAX_PIXELS} (4096 × 4096) a sample may have"
        ));
    }
    Ok(())
}

/// Width, height, channels and interleaved 8-bit samples of a PNG.
fn decode_png(bytes: &[u8]) -> Result<(usize, usize, usize, Vec<u8>), String> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().map_err(|e| e.to_string())?;
    let header = reader.info();
    check_size(header.width as usize, header.height as usize)?;
    let size = reader
        .output_buffer_size()
        .ok_or("the image is too large")?;
    let mut buf = vec![0; size];
    let info = reader.next_frame(&mut buf).map_err(|e| e.to_string())?;
    let channels = info.color_type.samples();
    let (width, height) = (info.width as usize, info.height as usize);
    if info.line_size != width * channels || buf.len() < height * info.line_size {
        return Err(format!("unexpected layout {info:?}"));
    }
    buf.truncate(height * info.line_size);
    Ok((width, height, channels, buf))
}

/// Width, height, channels and interleaved 8-bit samples of a JPEG (gray stays gray, every
/// other colour space becomes RGB).
fn decode_jpeg(bytes: &[u8]) -> Result<(usize, usize, usize, Vec<u8>), String> {
    use zune_jpeg::zune_core::bytestream::ZCursor;
    use zune_jpeg::zune_core::colorspace::ColorSpace;
    use zune_jpeg::zune_core::options::DecoderOptions;
    let mut probe = zune_jpeg::JpegDecoder::new(ZCursor::new(bytes));
    probe.decode_headers().map_err(|e| e.to_string())?;
    let info = probe.info().ok_or("no JPEG header")?;
    check_size(usize::from(info.width), usize::from(info.height))?;
    let (out, channels) = match info.components {
        1 => (ColorSpace::Luma, 1),
        _ => (ColorSpace::RGB, 3),
    };
    let options = DecoderOptions::default().jpeg_set_out_colorspace(out);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    let pixels = decoder.decode().map_err(|e| e.to_string())?;
    let (width, height) = (usize::from(info.width), usize::from(info.height));
    if pixels.len() < width * height * channels {
        return Err(format!(
            "{} samples decoded for {width} × {height} × {channels}",
            pixels.len()
        ));
    }
    Ok((width, height, channels, pixels))
}

/// Writes one 8-bit grayscale PNG of `width × height` samples in `[0, 1]` (rounded to the
/// nearest of 256 levels) at `path`.
pub fn write_gray_png(
    path: &Path,
    width: u32,
    height: u32,
    samples: &[f32],
) -> Result<(), FileError> {
    let io = io_error(path);
    let bytes: Vec<u8> = samples
        .iter()
        .map(|&v| (v.clamp(0.0, 1.0) * 255.0).round() as u8)
        .collect();
    let file = std::fs::File::create(path).map_err(&io)?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Eight);
    let encoding = |e: png::EncodingError| io(std::io::Error::other(e));
    let mut writer = encoder.write_header().map_err(encoding)?;
    writer.write_image_data(&bytes).map_err(encoding)?;
    writer.finish().map_err(encoding)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG whose header says more than [`MAX_PIXELS`] is refused from its header, and one
    /// at the limit's side decodes.
    #[test]
    fn an_image_over_the_pixel_limit_is_refused_from_its_header() {
        let png = |width: u32, height: u32| {
            let mut bytes = Vec::new();
            let mut encoder = png::Encoder::new(&mut bytes, width, height);
            encoder.set_color(png::ColorType::Grayscale);
            encoder.set_depth(png::BitDepth::Eight);
            let mut writer = encoder.write_header().expect("header");
            let samples = vec![0u8; width as usize * height as usize];
            writer.write_image_data(&samples).expect("pixels");
            writer.finish().expect("finished");
            bytes
        };
        let e = decode_png(&png(4097, 4096)).expect_err("too many pixels");
        assert!(e.contains("4097 × 4096 pixels"), "{e}");
        let (width, height, channels, _) = decode_png(&png(16, 8)).expect("decodes");
        assert_eq!((width, height, channels), (16, 8, 1));
    }
}
