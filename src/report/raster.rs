//! plotters' bitmap backend with text drawn right.
//!
//! plotters 0.3.7 rasterises ab_glyph text by putting each glyph's pixels at the pen position
//! without the glyph's left side bearing, so narrow letters slide into their neighbours ("cl"
//! reads as "d"). [`Raster`] hands every drawing call to [`BitMapBackend`] except text, which it
//! lays out with the same advances and kerning that plotters measured the text with, but with
//! each glyph placed at its true bounds. Vertical placement, anchors and rotation follow
//! plotters' own `draw_text`, so labels land where the chart's layout expects them.

use ab_glyph::{Font, FontRef, ScaleFont, point};
use plotters::backend::BitMapBackend;
use plotters::prelude::DrawingBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};

type BitmapError = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

/// A [`BitMapBackend`] that draws all text in one font (the report's DejaVu Sans).
pub struct Raster<'a> {
    inner: BitMapBackend<'a>,
    font: FontRef<'static>,
}

impl<'a> Raster<'a> {
    pub fn new(inner: BitMapBackend<'a>, font: FontRef<'static>) -> Self {
        Self { inner, font }
    }
}

impl DrawingBackend for Raster<'_> {
    type ErrorType = BitmapError;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        (width, height): (u32, u32),
        source: &[u8],
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        self.inner.blit_bitmap(pos, (width, height), source)
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<BitmapError>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let transform = style.transform();
        let (w, h) = self.get_size();
        for (x, y, coverage) in glyph_pixels(&self.font, style.size() as f32, text) {
            let (x, y) = transform.transform(x + dx - min_x, y + dy - min_y);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if x >= 0 && x < w as i32 && y >= 0 && y < h as i32 {
                let alpha = color.alpha * f64::from(coverage.min(1.0));
                self.inner
                    .draw_pixel((x, y), BackendColor { alpha, ..color })?;
            }
        }
        Ok(())
    }
}

/// `(x, y, coverage)` of every pixel the text covers, relative to its layout origin: pen
/// positions from advances and kerning (as plotters measures them), each glyph placed at its
/// pixel bounds, its top at `size / 2` above the glyph's own top as plotters does.
fn glyph_pixels(font: &FontRef<'static>, size: f32, text: &str) -> Vec<(i32, i32, f32)> {
    let scaled = font.as_scaled(size);
    let mut pixels = Vec::new();
    let mut pen = 0f32;
    let mut previous = None;
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(previous) = previous {
            pen += scaled.kern(previous, id);
        }
        previous = Some(id);
        let glyph = id.with_scale_and_position(size, point(pen, 0.0));
        if let Some(outline) = scaled.outline_glyph(glyph) {
            let bounds = outline.px_bounds();
            let left = bounds.min.x as i32;
            let top = (size / 2.0 + bounds.min.y) as i32;
            outline.draw(|x, y, coverage| {
                if coverage > 0.0 {
                    pixels.push((left + x as i32, top + y as i32, coverage));
                }
            });
        }
        pen += scaled.h_advance(id);
    }
    pixels
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In "cl" at 14 px, the c's right bearing and the l's left bearing (about 2 px together in
    /// DejaVu Sans) leave a clear column between the letters; plotters' own placement, which
    /// drops the bearing, joins them into a "d".
    #[test]
    fn letters_keep_their_side_bearings() {
        let font = FontRef::try_from_slice(dejavu::sans::regular()).unwrap();
        let inked: std::collections::BTreeSet<i32> = glyph_pixels(&font, 14.0, "cl")
            .iter()
            .filter(|p| p.2 > 0.5)
            .map(|p| p.0)
            .collect();
        let (first, last) = (inked.first().unwrap(), inked.last().unwrap());
        let gaps = (*first..=*last).filter(|x| !inked.contains(x)).count();
        assert!(gaps >= 1, "no clear column between c and l: {inked:?}");
    }
}
