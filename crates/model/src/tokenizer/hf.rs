//! Reading Hugging Face `tokenizer.json` and `tokenizer_config.json`.

use serde_json::Value;

use super::pretok::GPT2_PATTERN;
use super::spm::{SPACE, byte_token};
use super::{BpeConfig, PreTokStep, PreTokenizer, SpmConfig, TokenId, TokenType, TokenizerError};

/// Largest token id accepted from a JSON file (guards against absurd allocations).
const MAX_ID: u64 = 1 << 24;

/// The parts of `tokenizer_config.json` that matter for tokenizing and chatting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HfTokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// The chat template (the `"default"` one when the file lists several).
    pub chat_template: Option<String>,
}

fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

impl HfTokenizerConfig {
    /// Parses the text of a `tokenizer_config.json`.
    pub fn parse(json: &str) -> Result<HfTokenizerConfig, TokenizerError> {
        let v: Value = serde_json::from_str(json)
            .map_err(|e| TokenizerError::Json(format!("tokenizer_config.json: {e}")))?;
        let o = v
            .as_object()
            .ok_or_else(|| TokenizerError::Json("tokenizer_config.json: not an object".into()))?;
        let chat_template = match o.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => {
                let named = |want: Option<&str>| {
                    list.iter().find_map(|t| {
                        let name = t.get("name").and_then(Value::as_str);
                        if want.is_none() || name == want {
                            t.get("template").and_then(Value::as_str).map(String::from)
                        } else {
                            None
                        }
                    })
                };
                named(Some("default")).or_else(|| named(None))
            }
            _ => None,
        };
        Ok(HfTokenizerConfig {
            bos_token: token_string(o.get("bos_token")),
            eos_token: token_string(o.get("eos_token")),
            pad_token: token_string(o.get("pad_token")),
            unk_token: token_string(o.get("unk_token")),
            add_bos_token: o.get("add_bos_token").and_then(Value::as_bool),
            add_eos_token: o.get("add_eos_token").and_then(Value::as_bool),
            chat_template,
        })
    }
}

fn err(m: impl Into<String>) -> TokenizerError {
    TokenizerError::Json(m.into())
}

fn type_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn pre_steps(
    v: &Value,
    steps: &mut Vec<PreTokStep>,
    byte_level: &mut bool,
) -> Result<(), TokenizerError> {
    match type_of(v) {
        "Sequence" => {
            let list = v
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or_else(|| err("pre_tokenizer Sequence without pretokenizers"))?;
            for p in list {
                pre_steps(p, steps, byte_level)?;
            }
        }
        "ByteLevel" => {
            if v.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
                return Err(TokenizerError::UnsupportedPreTokenizer(
                    "ByteLevel with add_prefix_space = true".into(),
                ));
            }
            if v.get("use_regex").and_then(Value::as_bool).unwrap_or(true) {
                steps.push(PreTokStep::Regex(GPT2_PATTERN.into()));
            }
            *byte_level = true;
        }
        "Digits" => {
            if v.get("individual_digits")
                .and_then(Value::as_bool)
                .unwrap_or(false)
            {
                steps.push(PreTokStep::IndividualDigits);
            } else {
                steps.push(PreTokStep::DigitRuns);
            }
        }
        "Split" => {
            let behavior = v.get("behavior").and_then(Value::as_str).unwrap_or("");
            let invert = v.get("invert").and_then(Value::as_bool).unwrap_or(false);
            if !behavior.eq_ignore_ascii_case("isolated") || invert {
                return Err(TokenizerError::UnsupportedPreTokenizer(format!(
                    "Split with behavior {behavior:?}, invert {invert} (only Isolated, not inverted)"
                )));
            }
            let pattern = v
                .get("pattern")
                .ok_or_else(|| err("Split without pattern"))?;
            let regex = if let Some(r) = pattern.get("Regex").and_then(Value::as_str) {
                r.to_string()
            } else if let Some(s) = pattern.get("String").and_then(Value::as_str) {
                regex_escape(s)
            } else {
                return Err(err("Split pattern is neither Regex nor String"));
            };
            steps.push(PreTokStep::Regex(regex));
        }
        other => {
            return Err(TokenizerError::UnsupportedPreTokenizer(format!(
                "tokenizer.json pre_tokenizer {other:?}"
            )));
        }
    }
    Ok(())
}

fn normalizer_nfc(v: &Value) -> Result<bool, TokenizerError> {
    match v {
        Value::Null => Ok(false),
        _ => match type_of(v) {
            "NFC" => Ok(true),
            "Sequence" => {
                let mut nfc = false;
                for n in v
                    .get("normalizers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    nfc |= normalizer_nfc(n)?;
                }
                Ok(nfc)
            }
            other => Err(TokenizerError::Unsupported(format!("normalizer {other:?}"))),
        },
    }
}

fn decoder_is_byte_level(v: &Value) -> bool {
    match type_of(v) {
        "ByteLevel" => true,
        "Sequence" => v
            .get("decoders")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(decoder_is_byte_level)),
        _ => false,
    }
}

/// What a post-processor adds: (bos token, eos token) spellings.
fn post_processor(
    v: &Value,
    bos: &mut Option<String>,
    eos: &mut Option<String>,
) -> Result<(), TokenizerError> {
    match v {
        Value::Null => Ok(()),
        _ => match type_of(v) {
            "ByteLevel" => Ok(()),
            "Sequence" => {
                for p in v
                    .get("processors")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    post_processor(p, bos, eos)?;
                }
                Ok(())
            }
            "TemplateProcessing" => {
                let single = v
                    .get("single")
                    .and_then(Value::as_array)
                    .ok_or_else(|| err("TemplateProcessing without single"))?;
                let mut seen_seq = false;
                for item in single {
                    if item.get("Sequence").is_some() {
                        seen_seq = true;
                    } else if let Some(id) =
                        item.pointer("/SpecialToken/id").and_then(Value::as_str)
                    {
                        // The special_tokens map may spell it differently; take its first token.
                        let token = v
                            .pointer(&format!(
                                "/special_tokens/{}/tokens/0",
                                id.replace('~', "~0").replace('/', "~1")
                            ))
                            .and_then(Value::as_str)
                            .unwrap_or(id)
                            .to_string();
                        if seen_seq {
                            *eos = Some(token);
                        } else {
                            *bos = Some(token);
                        }
                    }
                }
                Ok(())
            }
            other => Err(TokenizerError::Unsupported(format!(
                "post_processor {other:?}"
            ))),
        },
    }
}

pub(crate) fn config_from_tokenizer_json(
    json: &str,
    cfg: Option<&HfTokenizerConfig>,
) -> Result<BpeConfig, TokenizerError> {
    let root: Value =
        serde_json::from_str(json).map_err(|e| err(format!("tokenizer.json: {e}")))?;
    let model = root
        .get("model")
        .ok_or_else(|| err("tokenizer.json has no \"model\""))?;
    let mtype = type_of(model);
    if !(mtype == "BPE" || mtype.is_empty() && model.get("merges").is_some()) {
        return Err(TokenizerError::UnsupportedModel(format!(
            "tokenizer.json model type {mtype:?}"
        )));
    }
    // SentencePiece's BPE, converted: characters merge, bytes stand in for the others.
    let sentencepiece = model.get("byte_fallback").and_then(Value::as_bool) == Some(true);
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if model
            .get(key)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(TokenizerError::Unsupported(format!("BPE {key}")));
        }
    }
    let ignore_merges = model
        .get("ignore_merges")
        .and_then(Value::as_bool)
        .unwrap_or(false);

    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| err("model.vocab is not an object"))?;
    let mut entries: Vec<(u64, String, TokenType)> = Vec::with_capacity(vocab.len() + 64);
    for (tok, id) in vocab {
        let id = id
            .as_u64()
            .filter(|&i| i < MAX_ID)
            .ok_or_else(|| err(format!("bad id for token {tok:?}")))?;
        entries.push((id, tok.clone(), TokenType::Normal));
    }
    for a in root
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let id = a
            .get("id")
            .and_then(Value::as_u64)
            .filter(|&i| i < MAX_ID)
            .ok_or_else(|| err("added token without a valid id"))?;
        let content = a
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| err("added token without content"))?;
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        let ty = if special {
            TokenType::Control
        } else {
            TokenType::UserDefined
        };
        entries.push((id, content.to_string(), ty));
    }
    let size = entries.iter().map(|e| e.0 + 1).max().unwrap_or(0) as usize;
    // Ids index tables as long as the largest one: a few holes are fine, a lone huge id is not.
    if size > 2 * entries.len() + 65536 {
        return Err(err(format!(
            "token ids reach {} for {} tokens: the ids must be about contiguous",
            size - 1,
            entries.len()
        )));
    }
    let mut tokens = vec![String::new(); size];
    let mut types = vec![TokenType::Unused; size];
    let mut filled = vec![false; size];
    // Added tokens come last, so they override the model's entry for the same id.
    for (id, tok, ty) in entries {
        let i = id as usize;
        if filled[i] && ty == TokenType::Normal {
            return Err(err(format!("two vocabulary tokens have id {i}")));
        }
        tokens[i] = tok;
        types[i] = ty;
        filled[i] = true;
    }

    if sentencepiece {
        for (t, ty) in tokens.iter().zip(types.iter_mut()) {
            if *ty == TokenType::Normal && byte_token(t).is_some() {
                *ty = TokenType::Byte;
            }
        }
    }

    let mut pairs = Vec::new();
    for (i, m) in model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| err("model.merges is not an array"))?
        .iter()
        .enumerate()
    {
        match m {
            Value::String(s) => match s.split_once(' ') {
                Some((a, b)) => pairs.push((a.to_string(), b.to_string())),
                None => return Err(err(format!("merge #{i} {s:?} is not \"a b\""))),
            },
            Value::Array(p) if p.len() == 2 => {
                let (Some(a), Some(b)) = (p[0].as_str(), p[1].as_str()) else {
                    return Err(err(format!("merge #{i} is not two strings")));
                };
                if !sentencepiece && (a.contains(' ') || b.contains(' ')) {
                    return Err(TokenizerError::Unsupported(format!(
                        "merge #{i} has a token containing a space"
                    )));
                }
                pairs.push((a.to_string(), b.to_string()));
            }
            _ => return Err(err(format!("merge #{i} is neither \"a b\" nor [a, b]"))),
        }
    }

    let normalizer = root.get("normalizer").unwrap_or(&Value::Null);
    let pre_tokenizer = root.get("pre_tokenizer").filter(|p| !p.is_null());
    let mut steps = Vec::new();
    let (mut nfc, mut merges, mut spm) = (false, Vec::new(), None);
    if sentencepiece {
        spm = Some(SpmConfig {
            scores: vec![0.0; tokens.len()],
            add_space_prefix: spm_space_prefix(normalizer)?,
            merges: std::mem::take(&mut pairs),
        });
        // A split at spaces after they became U+2581 splits nothing.
        if let Some(p) = pre_tokenizer.filter(|p| {
            type_of(p) != "Split"
                || p.pointer("/pattern/String").and_then(Value::as_str) != Some(" ")
        }) {
            return Err(TokenizerError::UnsupportedPreTokenizer(format!(
                "{:?} beside a SentencePiece vocabulary",
                type_of(p)
            )));
        }
    } else {
        nfc = normalizer_nfc(normalizer)?;
        let mut byte_level = false;
        if let Some(p) = pre_tokenizer {
            pre_steps(p, &mut steps, &mut byte_level)?;
        }
        let decoder = root.get("decoder").unwrap_or(&Value::Null);
        if !byte_level || !decoder_is_byte_level(decoder) {
            return Err(TokenizerError::Unsupported(
                "only byte-level BPE (ByteLevel pre-tokenizer and decoder) and SentencePiece \
                 BPE (byte_fallback) are supported"
                    .into(),
            ));
        }
        merges = pairs.iter().map(|(a, b)| format!("{a} {b}")).collect();
    }

    let (mut bos_tok, mut eos_tok) = (None, None);
    post_processor(
        root.get("post_processor").unwrap_or(&Value::Null),
        &mut bos_tok,
        &mut eos_tok,
    )?;
    let mut add_bos = bos_tok.is_some();
    let mut add_eos = eos_tok.is_some();
    let model_unk = model
        .get("unk_token")
        .and_then(Value::as_str)
        .map(String::from);
    let mut unk_tok = model_unk.clone();
    let mut pad_tok = None;
    if let Some(c) = cfg {
        bos_tok = c.bos_token.clone().or(bos_tok);
        eos_tok = c.eos_token.clone().or(eos_tok);
        pad_tok = c.pad_token.clone();
        unk_tok = c.unk_token.clone().or(unk_tok);
        add_bos = c.add_bos_token.unwrap_or(add_bos);
        add_eos = c.add_eos_token.unwrap_or(add_eos);
    }
    let lookup = |what: &str, t: Option<String>| -> Result<Option<TokenId>, TokenizerError> {
        match t {
            None => Ok(None),
            Some(t) => tokens
                .iter()
                .position(|x| *x == t)
                .map(|i| Some(i as TokenId))
                .ok_or_else(|| {
                    TokenizerError::Unsupported(format!(
                        "{what} token {t:?} is not in the vocabulary"
                    ))
                }),
        }
    };
    let bos_id = lookup("bos", bos_tok)?;
    let eos_id = lookup("eos", eos_tok)?;
    let pad_id = lookup("pad", pad_tok)?;
    let unk_id = lookup("unk", unk_tok)?;
    // Only a vocabulary entry can stand for bytes; a model-level name it lacks is ignored.
    let byte_unk_id = lookup("unk", model_unk).ok().flatten();

    Ok(BpeConfig {
        tokens,
        merges,
        token_types: types,
        pre: spm.is_none().then(|| PreTokenizer::canonical(steps)),
        nfc,
        ignore_merges,
        bos_id,
        eos_id,
        eot_id: None,
        pad_id,
        unk_id,
        byte_unk_id,
        add_bos: add_bos && bos_id.is_some(),
        add_eos: add_eos && eos_id.is_some(),
        spm,
    })
}

/// Whether a SentencePiece normalizer puts a space before the text: spaces must become U+2581
/// (`Replace`), after a `Prepend` of it where the model adds a space first.
fn spm_space_prefix(v: &Value) -> Result<bool, TokenizerError> {
    let steps: Vec<&Value> = match type_of(v) {
        "Sequence" => v
            .get("normalizers")
            .and_then(Value::as_array)
            .map(|n| n.iter().collect())
            .unwrap_or_default(),
        _ => vec![v],
    };
    let space = SPACE.to_string();
    let replaces = |n: &Value| {
        type_of(n) == "Replace"
            && n.pointer("/pattern/String").and_then(Value::as_str) == Some(" ")
            && n.get("content").and_then(Value::as_str) == Some(space.as_str())
    };
    let prepends = |n: &Value| {
        type_of(n) == "Prepend" && n.get("prepend").and_then(Value::as_str) == Some(space.as_str())
    };
    match steps[..] {
        [r] if replaces(r) => Ok(false),
        [p, r] if prepends(p) && replaces(r) => Ok(true),
        _ => Err(TokenizerError::Unsupported(
            "a SentencePiece normalizer other than Replace(' ', '▁'), after a Prepend of it or not"
                .into(),
        )),
    }
}
