//! The hidden widths width-slicing strategies (HeteroFL, FedRolex; docs/algorithms.md §8) may
//! narrow, read off an architecture's description without building it: for every width, the
//! tensor axes that follow it ([`WidthGroup`]). The server cuts the global model along them
//! ([`slice_state`](fedshard_protocol::width::slice_state)) and the client builds the narrowed
//! model from the cut tensors ([`Builder::with_width`](crate::models::builder::Builder::with_width)),
//! whose constructors ask for the same width names; the tests below hold the descriptions to the
//! tensors the builder records.
//!
//! Inputs, outputs, the transformers' residual width (embeddings, layer norms, the head) stay
//! whole: slicing them would change what the model reads or predicts, or every block at once.

use crate::models::NetError;
use crate::models::builder::Task;
use crate::models::cnn::{CnnShape, GROUPS};
use crate::models::net::Architecture;
use fedshard_protocol::width::{Axis, WidthGroup, WidthSlice};

/// `tensor`'s axis `axis`, a unit of the width being `block` consecutive indices of it.
fn axis(tensor: &str, axis: usize, block: usize) -> Axis {
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

impl Architecture {
    /// The widths a width strategy may narrow, in build order. Empty for ResNet-18, CCT and
    /// ONNX models: their widths are not described yet (residual additions tie ResNet's and
    /// CCT's channels across blocks, an ONNX graph's widths would have to be traced), so the
    /// server refuses width strategies for them.
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
            Architecture::CharTransformer(s) => (0..s.blocks)
                .flat_map(|i| {
                    let attn = |layer: &str, part: &str, ax: usize| {
                        axis(
                            &format!("block{i}.attn.{layer}.{part}"),
                            ax,
                            s.width / s.heads,
                        )
                    };
                    let mut heads = Vec::new();
                    for layer in ["q", "k", "v"] {
                        heads.extend([attn(layer, "weight", 0), attn(layer, "bias", 0)]);
                    }
                    heads.push(attn("o", "weight", 1));
                    let mlp = vec![
                        axis(&format!("block{i}.mlp.fc.weight"), 0, 1),
                        axis(&format!("block{i}.mlp.fc.bias"), 0, 1),
                        axis(&format!("block{i}.mlp.proj.weight"), 1, 1),
                    ];
                    [
                        group(&format!("block{i}.heads"), s.heads, 1, heads),
                        group(&format!("block{i}.mlp"), 4 * s.width, 1, mlp),
                    ]
                })
                .collect(),
            Architecture::Resnet18 { .. }
            | Architecture::Cct { .. }
            | Architecture::Onnx { .. } => Vec::new(),
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

    /// Every described architecture; ResNet-18, CCT describe none.
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
        for net in [
            Architecture::Resnet18 { classes: 10 },
            Architecture::Cct { classes: 10 },
        ] {
            assert!(net.width_groups().is_empty());
        }
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
