//! The weights spectral sharding may factorise, read off an architecture's description without
//! building it: every affine or convolutional weight but the first and last layer's (an MLP
//! without hidden layers, softmax regression, shards its one layer). The names and their order
//! are those the builder records in init mode ([`Architecture::initial_state`]); the test below
//! builds every architecture once and holds the two to the same list.

use crate::models::net::Architecture;

/// Transformer blocks of CCT-6/3x2 (`models::cct`).
const CCT_BLOCKS: usize = 6;

/// The four projections and the two feed-forward layers of transformer block `i`.
fn transformer_block(i: usize) -> impl Iterator<Item = String> {
    ["attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc", "mlp.proj"]
        .into_iter()
        .map(move |layer| format!("block{i}.{layer}.weight"))
}

impl Architecture {
    /// What `sharded_layers = ["all"]` expands to: [`Self::shardable_layers`], except that an
    /// ONNX model keeps its first and last Gemm/MatMul/Conv in graph order (the layer reading
    /// the input and the layer producing the logits) dense, as the shipped models do: a
    /// rank-r truncation of those loses the most, the input layer's few input channels and the
    /// logits' few classes leaving little spectrum to drop. A model of one layer shards it
    /// (like softmax regression); naming a first or last layer shards it.
    pub fn sharded_by_all(&self) -> Vec<String> {
        let all = self.shardable_layers();
        match self {
            Architecture::Onnx { .. } if all.len() > 1 => all[1..all.len() - 1].to_vec(),
            _ => all,
        }
    }

    /// The names of the weights spectral sharding may factorise, in the order the model builds
    /// them (what `sharded_layers = ["all"]` expands to, see [`Self::sharded_by_all`]).
    pub fn shardable_layers(&self) -> Vec<String> {
        match self {
            Architecture::Mlp { hidden, .. } => {
                let last = hidden.len();
                (0..=last)
                    .filter(|&i| last == 0 || (i != 0 && i != last))
                    .map(|i| format!("fc{i}.weight"))
                    .collect()
            }
            Architecture::DigitsCnn { .. } | Architecture::MnistCnn { .. } => {
                ["conv1.weight", "conv2.weight", "fc0.weight"]
                    .map(String::from)
                    .to_vec()
            }
            Architecture::CharTransformer(shape) => {
                (0..shape.blocks).flat_map(transformer_block).collect()
            }
            Architecture::Cct { .. } => (0..CCT_BLOCKS)
                .flat_map(transformer_block)
                .chain(std::iter::once("tokenizer1.weight".to_string()))
                .collect(),
            // Every Gemm/MatMul and Conv weight of one group, in the graph's order.
            Architecture::Onnx { path } => path
                .model
                .plan
                .layers
                .iter()
                .map(|l| l.weight().to_string())
                .collect(),
            Architecture::Resnet18 { .. } => {
                let mut names = Vec::new();
                for stage in 0..4 {
                    for block in 0..2 {
                        let name = format!("stage{stage}.block{block}");
                        // The first block of every stage but the first halves the image and
                        // widens the channels, so its skip path is a 1×1 convolution.
                        if stage > 0 && block == 0 {
                            names.push(format!("{name}.shortcut.weight"));
                        }
                        names.push(format!("{name}.conv1.weight"));
                        names.push(format!("{name}.conv2.weight"));
                    }
                }
                names
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::models::char_transformer::CharShape;
    use crate::models::net::Architecture;

    /// The described names are the built model's, in its order, for every architecture.
    #[test]
    fn names_match_the_built_models() {
        let architectures = [
            Architecture::Mlp {
                inputs: 64,
                hidden: vec![],
                classes: 10,
            },
            Architecture::Mlp {
                inputs: 64,
                hidden: vec![16],
                classes: 10,
            },
            Architecture::Mlp {
                inputs: 64,
                hidden: vec![16, 8, 4],
                classes: 10,
            },
            Architecture::DigitsCnn { classes: 10 },
            Architecture::MnistCnn { classes: 10 },
            Architecture::CharTransformer(CharShape::default()),
            Architecture::Resnet18 { classes: 10 },
            Architecture::Cct { classes: 100 },
        ];
        for net in architectures {
            let (_, built) = net.initial_state(0).expect("builds");
            assert_eq!(net.shardable_layers(), built, "{net:?}");
        }
    }
}
