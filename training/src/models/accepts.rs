//! Which data each model accepts, written once: the architectures of [`Architecture`] and the
//! masked network of FedPM ([`MaskedNetwork`]) each state the datasets whose examples they can
//! read and whose labels they predict. The run configuration asks these rules; it does not
//! restate them.

use crate::data::{cifar, digits, mnist, shakespeare};
use crate::models::NetError;
use crate::models::char_transformer::CharShape;
use crate::models::masked::MaskedNetwork;
use crate::models::net::Architecture;

/// The examples a labelled or text dataset feeds a model, by dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inputs {
    /// The 8×8 digits: 64 features, 10 classes.
    Digits,
    /// MNIST: 28×28 = 784 features, 10 classes.
    Mnist,
    /// CIFAR-10 or CIFAR-100: 3×32×32 = 3072 features, `classes` 10 or 100.
    Cifar { classes: usize },
    /// Shakespeare: windows of character codes, next-character prediction.
    Characters,
    /// A user's `files` dataset: rows of `dim` features, `classes` classes, known once read.
    Table { dim: usize, classes: usize },
}

impl Inputs {
    /// Features per example and classes of a labelled image dataset; `None` for text.
    pub fn image(self) -> Option<(usize, usize)> {
        match self {
            Inputs::Digits => Some((digits::DIM, digits::CLASSES)),
            Inputs::Mnist => Some((mnist::IMAGE_DIM, mnist::CLASSES)),
            Inputs::Cifar { classes } => Some((cifar::IMAGE_DIM, classes)),
            Inputs::Table { dim, classes } => Some((dim, classes)),
            Inputs::Characters => None,
        }
    }
}

impl Architecture {
    /// Whether this architecture reads `inputs`' examples and predicts its labels: an MLP any
    /// image dataset of its inputs and classes, each CNN its own image size, ResNet-18 and CCT
    /// CIFAR, the character transformer Shakespeare's vocabulary.
    pub fn accepts(&self, inputs: Inputs) -> bool {
        match (self, inputs) {
            (
                Architecture::Mlp {
                    inputs: width,
                    classes,
                    ..
                },
                inputs,
            ) => inputs.image() == Some((*width, *classes)),
            (Architecture::DigitsCnn { classes }, Inputs::Digits) => *classes == digits::CLASSES,
            (Architecture::MnistCnn { classes }, Inputs::Mnist) => *classes == mnist::CLASSES,
            (
                Architecture::Resnet18 { classes: c } | Architecture::Cct { classes: c },
                Inputs::Cifar { classes },
            ) => *c == classes,
            (Architecture::Onnx { path }, inputs) => {
                inputs.image() == Some((path.model.input_width(), path.model.plan.classes))
            }
            (Architecture::CharTransformer(shape), Inputs::Characters) => {
                shape.vocab == shakespeare::VOCAB_SIZE
            }
            (net, Inputs::Table { dim, classes }) => net.table_shape() == Some((dim, classes)),
            _ => false,
        }
    }

    /// The features per row and classes this architecture reads and predicts, for every
    /// architecture that reads rows of features (all but the character transformer).
    pub fn table_shape(&self) -> Option<(usize, usize)> {
        match self {
            Architecture::Mlp {
                inputs, classes, ..
            } => Some((*inputs, *classes)),
            Architecture::DigitsCnn { classes } => Some((digits::DIM, *classes)),
            Architecture::MnistCnn { classes } => Some((mnist::IMAGE_DIM, *classes)),
            Architecture::Resnet18 { classes } | Architecture::Cct { classes } => {
                Some((cifar::IMAGE_DIM, *classes))
            }
            Architecture::Onnx { path } => {
                Some((path.model.input_width(), path.model.plan.classes))
            }
            Architecture::CharTransformer(_) => None,
        }
    }

    /// The architectures that accept `inputs`, in words, for an error message.
    pub fn accepted_for(inputs: Inputs) -> String {
        match inputs {
            Inputs::Table { dim, classes } => format!(
                "mlp with inputs = {dim} and classes = {classes}, or a CNN of that input size \
                 (digits-cnn {}, mnist-cnn {}, resnet18 or cct {}) with classes = {classes}",
                digits::DIM,
                mnist::IMAGE_DIM,
                cifar::IMAGE_DIM
            ),
            Inputs::Characters => format!(
                "char-transformer with vocab = {} (the default)",
                CharShape::default().vocab
            ),
            Inputs::Cifar { classes } => format!(
                "resnet18 or cct with classes = {classes}, or mlp with inputs = {} and classes = \
                 {classes}",
                cifar::IMAGE_DIM
            ),
            Inputs::Digits => format!(
                "mlp with inputs = {} and classes = {}, or digits-cnn with classes = {}",
                digits::DIM,
                digits::CLASSES,
                digits::CLASSES
            ),
            Inputs::Mnist => format!(
                "mlp with inputs = {} and classes = {}, or mnist-cnn with classes = {}",
                mnist::IMAGE_DIM,
                mnist::CLASSES,
                mnist::CLASSES
            ),
        }
    }

    /// The sizes the architecture's layers need of each other (checked without building it):
    /// the character transformer's width must split into its heads.
    pub fn check_sizes(&self) -> Result<(), NetError> {
        match self {
            Architecture::CharTransformer(s)
                if s.heads == 0 || !s.width.is_multiple_of(s.heads) =>
            {
                Err(NetError::Heads {
                    name: "char-transformer".into(),
                    width: s.width,
                    heads: s.heads,
                })
            }
            _ => Ok(()),
        }
    }
}

impl MaskedNetwork {
    /// FedPM's masked network of `conv` channels and `hidden` widths on `inputs`: the 8×8
    /// digits or MNIST, whose features and classes give its first and last layer. `None` for
    /// the datasets it does not read (its convolutions take one square channel).
    pub fn for_inputs(inputs: Inputs, conv: &[usize], hidden: &[usize]) -> Option<Self> {
        let (inputs, classes) = match inputs {
            Inputs::Digits | Inputs::Mnist => inputs.image()?,
            Inputs::Cifar { .. } | Inputs::Characters | Inputs::Table { .. } => return None,
        };
        Some(MaskedNetwork {
            inputs,
            conv: conv.to_vec(),
            hidden: hidden.to_vec(),
            classes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every architecture accepts the data the shipped configs give it and nothing else of the
    /// same shape family.
    #[test]
    fn architectures_accept_their_datasets_only() {
        let mlp = |inputs, classes| Architecture::Mlp {
            inputs,
            hidden: vec![8],
            classes,
        };
        assert!(mlp(64, 10).accepts(Inputs::Digits));
        assert!(!mlp(64, 10).accepts(Inputs::Mnist));
        assert!(mlp(784, 10).accepts(Inputs::Mnist));
        assert!(mlp(3072, 100).accepts(Inputs::Cifar { classes: 100 }));
        assert!(!mlp(3072, 100).accepts(Inputs::Cifar { classes: 10 }));
        assert!(Architecture::DigitsCnn { classes: 10 }.accepts(Inputs::Digits));
        assert!(!Architecture::DigitsCnn { classes: 10 }.accepts(Inputs::Mnist));
        assert!(Architecture::MnistCnn { classes: 10 }.accepts(Inputs::Mnist));
        assert!(Architecture::Resnet18 { classes: 10 }.accepts(Inputs::Cifar { classes: 10 }));
        assert!(!Architecture::Cct { classes: 10 }.accepts(Inputs::Cifar { classes: 100 }));
        // A `files` table: read by any architecture of its row size and classes.
        let table = |dim, classes| Inputs::Table { dim, classes };
        assert!(mlp(64, 10).accepts(table(64, 10)));
        assert!(!mlp(64, 10).accepts(table(32, 10)));
        assert!(Architecture::DigitsCnn { classes: 3 }.accepts(table(64, 3)));
        assert!(Architecture::MnistCnn { classes: 10 }.accepts(table(784, 10)));
        assert!(Architecture::Resnet18 { classes: 7 }.accepts(table(3072, 7)));
        assert!(!Architecture::Cct { classes: 7 }.accepts(table(3072, 8)));
        let chars = Architecture::CharTransformer(CharShape::default());
        assert!(!chars.accepts(table(64, 10)));
        assert!(chars.accepts(Inputs::Characters));
        assert!(!chars.accepts(Inputs::Digits));
        assert!(MaskedNetwork::for_inputs(Inputs::Cifar { classes: 10 }, &[], &[8]).is_none());
        let masked = MaskedNetwork::for_inputs(Inputs::Mnist, &[], &[8]).expect("mnist fits");
        assert_eq!((masked.inputs, masked.classes), (784, 10));
    }
}
