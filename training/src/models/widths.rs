//! The hidden widths width-slicing strategies (HeteroFL, FedRolex, FjORD; docs/algorithms.md
//! §8) may narrow, read off an architecture's description without building it: for every width,
//! the tensor axes that follow it ([`WidthGroup`]). The server cuts the global model along them
//! ([`slice_state`](fedshard_protocol::width::slice_state)) and the client builds the narrowed
//! model from the cut tensors ([`Builder::with_width`](crate::models::builder::Builder::with_width)),
//! whose constructors ask for the same width names; the tests below hold the descriptions to the
//! tensors the builder records.
//!
//! Inputs, outputs, the transformers' residual width (embeddings, layer norms, the head) stay
//! whole: slicing them would change what the model reads or predicts, or every block at once.
//! ResNet-18's residual streams are sliced, but each as one width: every tensor that writes or
//! reads a stream keeps the same channels, so the residual sums still add matching channels.

use crate::models::NetError;
use crate::models::builder::Task;
use crate::models::cnn::{CnnShape, GROUPS};
use crate::models::net::Architecture;
use crate::models::resnet::{
    BLOCKS_PER_STAGE, NORM_GROUPS as RESNET_GROUPS, STAGE_WIDTHS, projects,
};
use fedshard_protocol::width::{Axis, WidthGroup, WidthSlice};

/// `tensor`'s axis `axis`, a unit of the width being `block` consecutive indices of it.
pub(crate) fn axis(tensor: &str, axis: usize, block: usize) -> Axis {
    Axis {
        tensor: tensor.to_string(),
        axis,
        block,
    }
}

/// Width `name` of `units` units in `norm_groups` norm groups, along `axes`.
fn group(name: &str, units: usize, norm_groups: usize, axes: Vec<Axis>) -> WidthGroup {
    WidthGroup {
        name: name.to_string(),
        units,
        norm_groups,
        axes,
    }
}

/// The CNN's widths: each convolution's channels (its GroupNorm's groups kept whole-sized) and
/// `fc0`'s units. `conv2`'s pooled output is flattened channel-major, so a channel is
/// `(side/4)²` consecutive inputs of `fc0`.
fn cnn(shape: CnnShape) -> Vec<WidthGroup> {
    let flat_block = (shape.side / 4) * (shape.side / 4);
    let mut groups: Vec<WidthGroup> = (0..3)
        .map(|i| {
            let next = if i < 2 {
                axis(&format!("conv{}.weight", i + 1), 1, 1)
            } else {
                axis("fc0.weight", 1, flat_block)
            };
            let axes = vec![
                axis(&format!("conv{i}.weight"), 0, 1),
                axis(&format!("conv{i}.bias"), 0, 1),
                axis(&format!("norm{i}.weight"), 0, 1),
                axis(&format!("norm{i}.bias"), 0, 1),
                next,
            ];
            group(&format!("conv{i}"), shape.widths[i], GROUPS, axes)
        })
        .collect();
    let fc0 = ["fc0.weight", "fc0.bias", "norm3.weight", "norm3.bias"]
        .into_iter()
        .map(|t| axis(t, 0, 1))
        .chain(std::iter::once(axis("fc1.weight", 1, 1)))
        .collect();
    groups.push(group("fc0", shape.hidden, 1, fc0));
    groups
}

/// The widths of `blocks` pre-norm transformer blocks of residual width `width`: each block's
/// heads (a unit is a head: `head_dim = width / heads` rows of q, k and v and their biases,
/// as many columns of o) and its MLP's `hidden` units. o's bias, the projections' outputs, the
/// layer norms stay whole: they are the residual width every block adds into.
fn transformer(blocks: usize, width: usize, heads: usize, hidden: usize) -> Vec<WidthGroup> {
    (0..blocks)
        .flat_map(|i| {
            let attn = |layer: &str, part: &str, ax: usize| {
                axis(&format!("block{i}.attn.{layer}.{part}"), ax, width / heads)
            };
            let mut head_axes = Vec::new();
            for layer in ["q", "k", "v"] {
                head_axes.extend([attn(layer, "weight", 0), attn(layer, "bias", 0)]);
            }
            head_axes.push(attn("o", "weight", 1));
            let mlp = vec![
                axis(&format!("block{i}.mlp.fc.weight"), 0, 1),
                axis(&format!("block{i}.mlp.fc.bias"), 0, 1),
                axis(&format!("block{i}.mlp.proj.weight"), 1, 1),
            ];
            [
                group(&format!("block{i}.heads"), heads, 1, head_axes),
                group(&format!("block{i}.mlp"), hidden, 1, mlp),
            ]
        })
        .collect()
}

/// A GroupNorm's scale and shift, which follow its channels.
fn norm(name: &str) -> [Axis; 2] {
    [
        axis(&format!("{name}.weight"), 0, 1),
        axis(&format!("{name}.bias"), 0, 1),
    ]
}

/// ResNet-18's widths, from the input to the output: each stage's residual stream
/// (`stage{s}.residual`) and each block's inner channels (`stage{s}.block{i}.conv1`), all in the
/// GroupNorm's groups.
///
/// A block adds its second convolution's normalised output to its input (or to the input's 1×1
/// projection), so every tensor that writes a stream and every one that reads it must keep the
/// same channels, or the sums would add unrelated channels: one width per stream. Stage `s`'s
/// stream is written by the stem (stage 0, whose first block reads the stem's channels as they
/// are) or by the first block's projection (stages 1–3), and by both blocks' `conv2` and
/// `norm2`; it is read by both blocks' `conv1` (stage 0) or the second's (stages 1–3), then by
/// the next stage's first `conv1` and projection, or by the classifier after the pooling (one
/// value per channel). A block's inner channels are read by its `conv2` alone.
fn resnet18() -> Vec<WidthGroup> {
    let stages = STAGE_WIDTHS.len();
    let mut streams: Vec<Vec<Axis>> = vec![Vec::new(); stages];
    let mut inner: Vec<Vec<WidthGroup>> = vec![Vec::new(); stages];
    streams[0].push(axis("stem.weight", 0, 1));
    streams[0].extend(norm("stem_norm"));
    for (s, &channels) in STAGE_WIDTHS.iter().enumerate() {
        for i in 0..BLOCKS_PER_STAGE {
            let block = format!("stage{s}.block{i}");
            let input = if projects(s, i) { s - 1 } else { s };
            streams[input].push(axis(&format!("{block}.conv1.weight"), 1, 1));
            if projects(s, i) {
                streams[input].push(axis(&format!("{block}.shortcut.weight"), 1, 1));
                streams[s].push(axis(&format!("{block}.shortcut.weight"), 0, 1));
                streams[s].extend(norm(&format!("{block}.shortcut_norm")));
            }
            streams[s].push(axis(&format!("{block}.conv2.weight"), 0, 1));
            streams[s].extend(norm(&format!("{block}.norm2")));
            let mut axes = vec![axis(&format!("{block}.conv1.weight"), 0, 1)];
            axes.extend(norm(&format!("{block}.norm1")));
            axes.push(axis(&format!("{block}.conv2.weight"), 1, 1));
            inner[s].push(group(
                &format!("{block}.conv1"),
                channels,
                RESNET_GROUPS,
                axes,
            ));
        }
    }
    streams[stages - 1].push(axis("fc.weight", 1, 1));
    streams
        .into_iter()
        .zip(inner)
        .enumerate()
        .flat_map(|(s, (axes, blocks))| {
            let name = format!("stage{s}.residual");
            let stream = group(&name, STAGE_WIDTHS[s], RESNET_GROUPS, axes);
            std::iter::once(stream).chain(blocks)
        })
        .collect()
}

/// CCT's widths: the first tokenizer convolution's channels (read by the second alone; no
/// bias, no norm), then the blocks' heads and MLP units. The second tokenizer convolution
/// writes the embedding width, which stays whole.
fn cct() -> Vec<WidthGroup> {
    use crate::models::cct::{BLOCKS, HEADS, MLP_RATIO, TOKENIZER_CHANNELS, WIDTH};
    let tokenizer = vec![
        axis("tokenizer0.weight", 0, 1),
        axis("tokenizer1.weight", 1, 1),
    ];
    let mut groups = vec![group("tokenizer0", TOKENIZER_CHANNELS, 1, tokenizer)];
    groups.extend(transformer(BLOCKS, WIDTH, HEADS, MLP_RATIO * WIDTH));
    groups
}

impl Architecture {
    /// The widths a width strategy may narrow, from the input to the output; an ONNX model's
    /// are traced through its graph when the file is read (`models/onnx/widths.rs`).
    pub fn width_groups(&self) -> Vec<WidthGroup> {
        match self {
            Architecture::Mlp { hidden, .. } => hidden
                .iter()
                .enumerate()
                .map(|(i, &units)| {
                    let axes = vec![
                        axis(&format!("fc{i}.weight"), 0, 1),
                        axis(&format!("fc{i}.bias"), 0, 1),
                        axis(&format!("fc{}.weight", i + 1), 1, 1),
                    ];
                    group(&format!("fc{i}"), units, 1, axes)
                })
                .collect(),
            Architecture::DigitsCnn { .. } => cnn(CnnShape::DIGITS),
            Architecture::MnistCnn { .. } => cnn(CnnShape::MNIST),
            Architecture::CharTransformer(s) => {
                transformer(s.blocks, s.width, s.heads, 4 * s.width)
            }
            Architecture::Resnet18 { .. } => resnet18(),
            Architecture::Cct { .. } => cct(),
            Architecture::Onnx { path } => path.model.widths.groups.clone(),
        }
    }
}

/// The one width slice of a cohort's tasks (`None`: full width): its clients are stacked into
/// one model, so they must keep the same number of units of every width and share the keep
/// ratio (the scaler); which units each keeps may differ, the server cut them already.
pub fn cohort_width<'t>(tasks: &[Task<'t>]) -> Result<Option<&'t WidthSlice>, NetError> {
    let first = tasks.first().and_then(|t| t.2);
    let same = |w: Option<&WidthSlice>| match (first, w) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.keep_ratio.to_bits() == b.keep_ratio.to_bits() && a.widths() == b.widths()
        }
        _ => false,
    };
    if tasks.iter().all(|t| same(t.2)) {
        Ok(first)
    } else {
        Err(NetError::Cohort {
            name: "width".into(),
            what: "sub-models of different widths or keep ratios".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::char_transformer::CharShape;
    use fedshard_protocol::width::slice_state;

    /// Every described architecture (all but ONNX models).
    pub(crate) fn architectures() -> Vec<Architecture> {
        vec![
            Architecture::Mlp {
                inputs: 64,
                hidden: vec![],
                classes: 10,
            },
            Architecture::Mlp {
                inputs: 64,
                hidden: vec![16, 8],
                classes: 10,
            },
            Architecture::DigitsCnn { classes: 10 },
            Architecture::MnistCnn { classes: 10 },
            Architecture::CharTransformer(CharShape {
                vocab: 20,
                context: 8,
                width: 16,
                heads: 4,
                blocks: 2,
            }),
            Architecture::Resnet18 { classes: 10 },
            Architecture::Cct { classes: 10 },
        ]
    }

    /// Units `0, 2, 4, …` of each norm group of every width: half of them.
    pub(crate) fn half(groups: &[WidthGroup]) -> WidthSlice {
        let kept = groups
            .iter()
            .map(|g| {
                let per = g.units / g.norm_groups;
                let units = (0..g.units).filter(|u| (u % per) % 2 == 0).collect();
                (g.name.clone(), units)
            })
            .collect();
        WidthSlice {
            kept,
            keep_ratio: 0.5,
            local: Default::default(),
        }
    }

    /// Every described width fits the built model's tensors: keeping all units cuts nothing,
    /// keeping half cuts every axis a width runs along.
    #[test]
    fn groups_fit_the_built_models() {
        for net in architectures() {
            let (state, _) = net.initial_state(0).expect("builds");
            let groups = net.width_groups();
            let all = WidthSlice {
                kept: groups
                    .iter()
                    .map(|g| (g.name.clone(), (0..g.units).collect()))
                    .collect(),
                keep_ratio: 1.0,
                local: Default::default(),
            };
            assert_eq!(
                slice_state(&state, &groups, &all).unwrap(),
                state,
                "{net:?}"
            );
            let sub = slice_state(&state, &groups, &half(&groups)).expect("slices");
            for g in &groups {
                for a in &g.axes {
                    let full = state.get(&a.tensor).expect("named").shape[a.axis];
                    let cut = sub.get(&a.tensor).expect("named").shape[a.axis];
                    assert_eq!(2 * cut, full, "{net:?} {}", a.tensor);
                }
            }
        }
    }

    /// ResNet-18's stage-1 stream, by hand: written by the first block's projection and norm
    /// and both blocks' `conv2`/`norm2`, read by the second block's `conv1` and by stage 2's
    /// first `conv1` and projection; the first block's `conv1` reads stage 0's stream. The
    /// last stream feeds the classifier; 4 streams and 8 inner widths in all.
    #[test]
    fn resnet_streams_tie_every_tensor_that_writes_or_reads_them() {
        let groups = Architecture::Resnet18 { classes: 10 }.width_groups();
        let of = |name: &str| -> Vec<(String, usize)> {
            let g = groups.iter().find(|g| g.name == name).expect("described");
            g.axes.iter().map(|a| (a.tensor.clone(), a.axis)).collect()
        };
        let expected: Vec<(String, usize)> = [
            ("stage2.block0.conv1.weight", 1),
            ("stage2.block0.shortcut.weight", 1),
            ("stage1.block0.shortcut.weight", 0),
            ("stage1.block0.shortcut_norm.weight", 0),
            ("stage1.block0.shortcut_norm.bias", 0),
            ("stage1.block0.conv2.weight", 0),
            ("stage1.block0.norm2.weight", 0),
            ("stage1.block0.norm2.bias", 0),
            ("stage1.block1.conv1.weight", 1),
            ("stage1.block1.conv2.weight", 0),
            ("stage1.block1.norm2.weight", 0),
            ("stage1.block1.norm2.bias", 0),
        ]
        .into_iter()
        .map(|(t, a)| (t.to_string(), a))
        .collect();
        let mut found = of("stage1.residual");
        found.sort();
        let mut expected = expected;
        expected.sort();
        assert_eq!(found, expected);
        assert!(of("stage0.residual").contains(&("stem.weight".into(), 0)));
        assert!(of("stage0.residual").contains(&("stage0.block0.conv1.weight".into(), 1)));
        assert!(of("stage0.residual").contains(&("stage1.block0.conv1.weight".into(), 1)));
        assert!(of("stage3.residual").contains(&("fc.weight".into(), 1)));
        assert_eq!(
            of("stage2.block1.conv1"),
            [
                ("stage2.block1.conv1.weight".to_string(), 0),
                ("stage2.block1.norm1.weight".to_string(), 0),
                ("stage2.block1.norm1.bias".to_string(), 0),
                ("stage2.block1.conv2.weight".to_string(), 1),
            ]
        );
        assert_eq!(groups.len(), 12);
        assert!(groups.iter().all(|g| g.norm_groups == RESNET_GROUPS));
    }

    /// The narrowed build asks for exactly the sliced tensors (names and shapes), for every
    /// described architecture.
    #[test]
    fn a_narrowed_build_takes_the_sliced_tensors() {
        for net in architectures() {
            let (state, _) = net.initial_state(0).expect("builds");
            let groups = net.width_groups();
            let slice = half(&groups);
            let sub = slice_state(&state, &groups, &slice).expect("slices");
            let tasks = [(&sub, &[][..], Some(&slice))];
            let (built, layout) = crate::models::network::Network::load_cohort::<
                burn::backend::NdArray,
            >(&net, &tasks, &Default::default())
            .unwrap_or_else(|e| panic!("{net:?}: {e}"));
            let out = built.export(&layout, &tasks).expect("exports");
            assert_eq!(out[0].0, sub, "{net:?}");
        }
    }

    /// The work count of a half-width ResNet-18 and CCT, by hand (full counts as in
    /// `net.rs`'s hand count). ResNet-18: every convolution but the stem loses half its inputs
    /// and half its outputs (a quarter of its multiply-adds is left), the stem (3 input
    /// channels) and the classifier (10 classes) half. CCT: the first tokenizer convolution and
    /// the second (its input) keep half, every block's projections and MLP half, the pooling's
    /// scores, the classifier and the products between activations all.
    #[test]
    fn half_widths_cost_what_a_hand_count_says() {
        use fedshard_protocol::width::widths_at;
        use fedshard_protocol::work::ModelWork;
        let share = |net: Architecture| {
            let (state, _) = net.initial_state(0).expect("builds");
            let work = ModelWork::new(net.arithmetic().expect("builds"), &state);
            let groups = net.width_groups();
            let all = widths_at(&groups, 1.0).expect("ratio");
            assert_eq!(work.width_share(&state, &groups, &all), 1.0, "{net:?}");
            let half = widths_at(&groups, 0.5).expect("ratio");
            (work.width_share(&state, &groups, &half), work.full() as f64)
        };
        let (stem, fc) = (64.0 * 27.0 * 1024.0, 512.0 * 10.0);
        let (resnet, full) = share(Architecture::Resnet18 { classes: 10 });
        let expected = (stem / 2.0 + (full - stem - fc) / 4.0 + fc / 2.0) / full;
        assert!((resnet - expected).abs() < 1e-12, "{resnet} vs {expected}");
        let (tokenizer0, tokenizer1) = (64.0 * 27.0 * 1024.0, 256.0 * 576.0 * 256.0);
        let blocks = 64.0 * 6.0 * (4.0 * 256.0 * 256.0 + 2.0 * 256.0 * 512.0);
        let whole = 64.0 * 256.0 + 6.0 * 2.0 * 64.0 * 64.0 * 256.0 + 64.0 * 256.0 + 256.0 * 10.0;
        let (cct, full) = share(Architecture::Cct { classes: 10 });
        assert_eq!(full, tokenizer0 + tokenizer1 + blocks + whole);
        let expected = ((tokenizer0 + tokenizer1 + blocks) / 2.0 + whole) / full;
        assert!((cct - expected).abs() < 1e-12, "{cct} vs {expected}");
    }

    /// Tasks of one cohort must share their widths and keep ratio.
    #[test]
    fn a_cohort_of_different_widths_is_refused() {
        let net = &architectures()[1];
        let (state, _) = net.initial_state(0).expect("builds");
        let a = half(&net.width_groups());
        let b = WidthSlice {
            keep_ratio: 0.25,
            ..a.clone()
        };
        let same = [(&state, &[][..], Some(&a)), (&state, &[][..], Some(&a))];
        assert_eq!(cohort_width(&same).unwrap(), Some(&a));
        let mixed = [(&state, &[][..], Some(&a)), (&state, &[][..], Some(&b))];
        assert!(cohort_width(&mixed).is_err());
        let partly = [(&state, &[][..], Some(&a)), (&state, &[][..], None)];
        assert!(cohort_width(&partly).is_err());
    }
}
