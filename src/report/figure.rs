//! One line chart, drawn the same way as SVG (for pages and inlining) and as PNG (for anything
//! that shows a picture): a title, a round axis, a value axis and one line per series.
//!
//! Text is laid out with DejaVu Sans embedded in the binary (the `dejavu` crate, through
//! plotters' `ab_glyph` feature), so drawing needs no system font and gives the same picture on
//! every machine.

use super::raster::Raster;
use ab_glyph::FontRef;
use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::sync::OnceLock;

/// Pixel size of every figure: wide enough for a 1000-round axis and a legend of a few runs.
pub const SIZE: (u32, u32) = (800, 480);

/// One line of a figure: `(round, value)` points in round order; a non-finite value is a gap.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// How the value axis is chosen from the data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueAxis {
    /// From the smallest to the largest value, with a margin (losses).
    Fit,
    /// From 0 (or the smallest value, if negative) to the largest (counts, bits, ANME).
    FromZero,
    /// A fixed range, widened if a value falls outside it (accuracy in [0, 1]).
    Fixed(f64, f64),
}

/// Where the legend sits inside the plotting area.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Legend {
    /// No legend: the title says what the single line is.
    None,
    UpperRight,
    LowerRight,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub title: String,
    /// What the horizontal axis counts: `round`, or `version` for asynchronous runs.
    pub step: &'static str,
    pub value_label: String,
    pub value_axis: ValueAxis,
    pub legend: Legend,
    pub series: Vec<Series>,
}

/// Tableau's ten categorical colours: distinct in print and for the common colour-vision
/// deficiencies, enough for the eight strategies and the reference of a comparison.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Up to this many points a line also marks each round, so a short run's rounds can be counted.
const MARKED_POINTS: usize = 40;

const LEGEND_FONT: u32 = 14;
/// Legend width beyond its widest label: the colour sample and the gaps around it.
const LEGEND_PADDING: u32 = 48;
/// The legend's last line when there are more series than lines.
const MORE: &str = "… (more series)";

impl Figure {
    /// The figure as a standalone SVG document (`<svg …>…</svg>`, no XML declaration), so the
    /// same text can be written to a file or inlined into an HTML page.
    pub fn svg(&self) -> anyhow::Result<String> {
        register_font()?;
        let mut text = String::new();
        {
            let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present()
                .map_err(|e| anyhow!("drawing `{}`: {e}", self.title))?;
        }
        Ok(text)
    }

    /// The figure as a PNG file's bytes (8-bit RGB).
    pub fn png(&self) -> anyhow::Result<Vec<u8>> {
        register_font()?;
        let (width, height) = SIZE;
        let mut pixels = vec![0u8; width as usize * height as usize * 3];
        {
            let bitmap = BitMapBackend::with_buffer(&mut pixels, SIZE);
            let root = Raster::new(bitmap, font()?).into_drawing_area();
            self.draw(&root)?;
            root.present()
                .map_err(|e| anyhow!("drawing `{}`: {e}", self.title))?;
        }
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder
            .write_header()
            .and_then(|mut writer| writer.write_image_data(&pixels))
            .with_context(|| format!("encoding `{}` as PNG", self.title))?;
        Ok(bytes)
    }

    /// Writes `stem.svg` and `stem.png` into `dir`.
    pub fn write(&self, dir: &std::path::Path, stem: &str) -> anyhow::Result<()> {
        for (extension, bytes) in [("svg", self.svg()?.into_bytes()), ("png", self.png()?)] {
            let path = dir.join(format!("{stem}.{extension}"));
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        let failed =
            |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing `{}`: {e}", self.title);
        root.fill(&WHITE).map_err(failed)?;
        let body = root
            .margin(10, 0, 0, 0)
            .titled(&self.title, ("sans-serif", 22))
            .map_err(failed)?;
        let labels = self.legend_labels(&body)?;
        let (plot, legend) = if labels.is_empty() {
            (body, None)
        } else {
            let text: TextStyle = ("sans-serif", LEGEND_FONT).into();
            let mut widest = 0;
            for label in &labels {
                widest = widest.max(body.estimate_text_size(label, &text).map_err(failed)?.0);
            }
            let (plot, legend) = body.split_horizontally(SIZE.0 - widest - LEGEND_PADDING);
            (plot, Some(legend))
        };
        let (rounds, values) = self.ranges();
        let round_ticks = ((rounds.end - rounds.start).round() as usize + 1).clamp(2, 11);
        let mut chart = ChartBuilder::on(&plot)
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(rounds, values)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(205, 205, 205))
            .x_desc(self.step)
            .y_desc(self.value_label.as_str())
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 13))
            .x_labels(round_ticks)
            .y_labels(8)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| tick_label(*y))
            .draw()
            .map_err(failed)?;
        let widths = self.stroke_widths();
        for (i, series) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let style = color.stroke_width(widths[i]);
            for segment in segments(&series.points) {
                chart
                    .draw_series(LineSeries::new(segment.iter().copied(), style))
                    .map_err(failed)?;
                if series.points.len() <= MARKED_POINTS {
                    let marks = segment.iter().map(|&p| Circle::new(p, 3, color.filled()));
                    chart.draw_series(marks).map_err(failed)?;
                }
            }
        }
        if let Some(area) = legend {
            // Top-aligned with the plotting area (the chart's 12 px margin).
            for (i, label) in labels.iter().enumerate() {
                let y = 20 + 22 * i as i32;
                if i < self.series.len() && label != MORE {
                    let color = PALETTE[i % PALETTE.len()];
                    let line = PathElement::new(vec![(4, y), (28, y)], color.stroke_width(3));
                    area.draw(&line).map_err(failed)?;
                }
                let style = ("sans-serif", LEGEND_FONT)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Center));
                area.draw(&Text::new(label.as_str(), (34, y), style))
                    .map_err(failed)?;
            }
        }
        Ok(())
    }

    /// The legend's lines of text, beside the plot rather than on it so no line is hidden: one
    /// per series, shortened with `…` to at most a third of the figure's width, and a last line
    /// saying how many did not fit. Empty for [`Legend::None`].
    fn legend_labels<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> anyhow::Result<Vec<String>> {
        if self.legend == Legend::None || self.series.is_empty() {
            return Ok(Vec::new());
        }
        let text: TextStyle = ("sans-serif", LEGEND_FONT).into();
        let width = |label: &str| {
            area.estimate_text_size(label, &text)
                .map(|size| size.0)
                .map_err(|e| anyhow!("measuring `{label}`: {e}"))
        };
        let room = SIZE.0 / 3 - LEGEND_PADDING;
        let rows = ((SIZE.1 - 80) / 22) as usize;
        let mut labels = Vec::new();
        for series in self.series.iter().take(rows) {
            let mut label = series.label.clone();
            while width(&label)? > room && label.chars().count() > 4 {
                let keep = label.chars().count() - 2;
                label = label.chars().take(keep).collect::<String>() + "…";
            }
            labels.push(label);
        }
        if self.series.len() > rows {
            labels.truncate(rows - 1);
            labels.push(MORE.into());
        }
        Ok(labels)
    }

    /// Two series with the same points (every selected client accepted; no failures and no
    /// rejections) would hide one under the other: an earlier series is drawn wider by 2 px for
    /// each later one that repeats it, so its colour shows around theirs.
    fn stroke_widths(&self) -> Vec<u32> {
        let n = self.series.len();
        (0..n)
            .map(|i| {
                let repeats = (i + 1..n)
                    .filter(|&j| self.series[j].points == self.series[i].points)
                    .count();
                2 + 2 * repeats as u32
            })
            .collect()
    }

    /// The round axis spans the rounds of every series; the value axis follows [`ValueAxis`]
    /// over the finite values (0..1 when there are none), with small margins.
    fn ranges(&self) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
        let points = || self.series.iter().flat_map(|s| s.points.iter());
        let finite = || points().filter(|p| p.1.is_finite());
        let (mut lo_x, mut hi_x) = points().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.0), hi.max(p.0))
        });
        if lo_x > hi_x {
            (lo_x, hi_x) = (1.0, 1.0);
        }
        // Half a round either side (more on long runs), so the first and last points stand
        // clear of the frame.
        let pad_x = (0.01 * (hi_x - lo_x)).max(0.5);
        (lo_x, hi_x) = (lo_x - pad_x, hi_x + pad_x);
        let (lo, hi) = finite().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
        let (lo, hi) = if lo > hi { (0.0, 1.0) } else { (lo, hi) };
        let (a, b) = match self.value_axis {
            ValueAxis::Fit => (lo, hi),
            ValueAxis::FromZero => (lo.min(0.0), hi),
            ValueAxis::Fixed(a, b) => (a.min(lo), b.max(hi)),
        };
        // A flat line still needs a box to sit in: around its value, or 0..1 at zero.
        let (a, b) = if b - a > f64::EPSILON * b.abs().max(1.0) {
            (a, b)
        } else if b == 0.0 {
            (0.0, 1.0)
        } else {
            (a - 0.1 * b.abs(), b + 0.1 * b.abs())
        };
        // 3% below so a line at the lowest value is not drawn on the axis itself.
        let span = b - a;
        let (lo_y, hi_y) = (a - 0.03 * span, b + 0.05 * span);
        (lo_x..hi_x, lo_y..hi_y)
    }
}

/// The runs of consecutive finite points: a round with no value (a NaN loss) breaks the line
/// instead of being drawn as 0 or joined across.
fn segments(points: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for &p in points {
        match out.last_mut() {
            Some(current) if p.1.is_finite() => current.push(p),
            Some(current) if !current.is_empty() => out.push(Vec::new()),
            _ => {}
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// A value-axis tick: SI prefixes from ten thousand up (bits per round run to millions), at most
/// four decimals below (accuracy, ANME), trailing zeros dropped.
pub fn tick_label(value: f64) -> String {
    let trim = |text: String| {
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    };
    let magnitude = value.abs();
    for (scale, suffix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")] {
        if magnitude >= scale {
            let scale = if suffix == "k" { 1e3 } else { scale };
            return format!("{}{suffix}", trim(format!("{:.2}", value / scale)));
        }
    }
    let text = trim(format!("{value:.4}"));
    if text == "-0" { "0".into() } else { text }
}

/// The embedded DejaVu Sans, for [`Raster`]'s own text drawing.
fn font() -> anyhow::Result<FontRef<'static>> {
    FontRef::try_from_slice(dejavu::sans::regular()).map_err(|e| {
        anyhow!("the embedded DejaVu Sans font could not be read: {e} (a broken `dejavu` crate)")
    })
}

/// Registers the embedded DejaVu Sans as plotters' `sans-serif`, once per process: plotters
/// measures every label with it to lay the chart out, for SVG and PNG alike.
fn register_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!(
            "the embedded DejaVu Sans font could not be read (a broken build of the `dejavu` crate)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_short() {
        let cases = [
            (0.0, "0"),
            (0.25, "0.25"),
            (0.1 + 0.2, "0.3"),
            (2.5, "2.5"),
            (9999.0, "9999"),
            (12_000.0, "12k"),
            (2_500_000.0, "2.5M"),
            (3.2e9, "3.2G"),
            (-0.00001, "0"),
        ];
        for (value, text) in cases {
            assert_eq!(tick_label(value), text, "{value}");
        }
    }

    #[test]
    fn gaps_split_lines() {
        let points = [
            (1.0, 1.0),
            (2.0, f64::NAN),
            (3.0, 3.0),
            (4.0, 4.0),
            (5.0, f64::INFINITY),
        ];
        assert_eq!(
            segments(&points),
            [vec![(1.0, 1.0)], vec![(3.0, 3.0), (4.0, 4.0)]]
        );
        assert!(segments(&[(1.0, f64::NAN)]).is_empty());
    }

    /// A flat series, one round, or no values at all still give a non-empty box to draw in.
    #[test]
    fn degenerate_ranges_are_widened() {
        let figure = |points: Vec<(f64, f64)>, value_axis| Figure {
            title: "t".into(),
            step: "round",
            value_label: "v".into(),
            value_axis,
            legend: Legend::None,
            series: vec![Series {
                label: "s".into(),
                points,
            }],
        };
        let close = |r: std::ops::Range<f64>, start: f64, end: f64| {
            (r.start - start).abs() < 1e-12 && (r.end - end).abs() < 1e-12
        };
        let (x, y) = figure(vec![(3.0, 5.0)], ValueAxis::Fit).ranges();
        assert!(close(x, 2.5, 3.5), "half a round either side");
        assert!(
            close(y, 4.5 - 0.03, 5.5 + 0.05),
            "±10% around a flat line, then margins"
        );
        let (_, y) = figure(vec![(1.0, 0.0), (2.0, 0.0)], ValueAxis::FromZero).ranges();
        assert!(close(y, -0.03, 1.05));
        let (_, y) = figure(vec![(1.0, f64::NAN)], ValueAxis::Fixed(0.0, 1.0)).ranges();
        assert!(close(y, -0.03, 1.05));
        let (_, y) = figure(vec![(1.0, 0.5), (2.0, 1.2)], ValueAxis::Fixed(0.0, 1.0)).ranges();
        assert!(
            close(y, -0.036, 1.26),
            "a value above the fixed range widens it"
        );
    }
}
