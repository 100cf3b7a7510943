//! The one error type shared by every AtomRL atomic crate.

/// Result alias used across AtomRL libraries.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything an atomic function can reject or fail on.
///
/// Each variant names the function and the argument at fault, with what was expected and what
/// was given, so that a one-line `{err}` is enough for a user to fix the call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor argument has the wrong rank or dimensions.
    #[error("{func}: `{arg}` has shape {got:?}, expected {expected}")]
    Shape {
        /// Function that rejected the input.
        func: String,
        /// Argument name.
        arg: String,
        /// Expected shape, in the `[N, T]` notation.
        expected: String,
        /// Actual dimensions.
        got: Vec<usize>,
    },
    /// An argument has a value outside its domain (e.g. `group_size = 1`, a NaN reward).
    #[error("{func}: `{arg}` must be {expected}, got {got}")]
    Value {
        /// Function that rejected the input.
        func: String,
        /// Argument name (with an index where useful, e.g. `rewards[3]`).
        arg: String,
        /// What a valid value looks like.
        expected: String,
        /// The offending value.
        got: String,
    },
    /// A string option is not one of the known choices.
    #[error("{func}: `{arg}` must be one of {allowed}, got `{got}`")]
    UnknownChoice {
        /// Function that rejected the input.
        func: String,
        /// Argument name.
        arg: String,
        /// The accepted values, comma separated.
        allowed: String,
        /// The given value.
        got: String,
    },
    /// A required argument is absent.
    #[error("{func}: missing required argument `{arg}` ({expected})")]
    Missing {
        /// Function that rejected the input.
        func: String,
        /// Argument name.
        arg: String,
        /// What should have been given.
        expected: String,
    },
    /// An input field is not known to the function (usually a typo).
    #[error("{func}: unknown argument `{arg}`; known arguments: {known}")]
    UnknownArgument {
        /// Function that rejected the input.
        func: String,
        /// The unknown field.
        arg: String,
        /// The function's arguments, comma separated.
        known: String,
    },
    /// A file could not be read, parsed or written.
    #[error("{path}: {message}")]
    File {
        /// The file, with `:line` when a line is at fault.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// An error from candle while computing (not an input error).
    #[error("{func}: tensor operation failed: {source}")]
    Candle {
        /// Function that was computing.
        func: String,
        /// The underlying candle error.
        #[source]
        source: candle_core::Error,
    },
}

impl Error {
    /// A [`Error::Shape`] error.
    pub fn shape(func: &str, arg: &str, expected: impl Into<String>, got: &[usize]) -> Self {
        Self::Shape {
            func: func.into(),
            arg: arg.into(),
            expected: expected.into(),
            got: got.to_vec(),
        }
    }

    /// A [`Error::Value`] error.
    pub fn value(
        func: &str,
        arg: impl Into<String>,
        expected: impl Into<String>,
        got: impl std::fmt::Display,
    ) -> Self {
        Self::Value {
            func: func.into(),
            arg: arg.into(),
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    /// This error as a configuration key's: a [`Error::Value`] about argument `arg` becomes
    /// one about the key `table.arg` of `config`, for a function whose arguments are a
    /// table's keys (a library call made with a `[critic]` table's sizes reports the key the
    /// user wrote). Other errors are returned as they are.
    ///
    /// ```
    /// use atomrl_core::Error;
    /// let e = Error::value("ValueModel::from_policy_cut", "num_layers", "in 1..=4", 9);
    /// assert_eq!(e.in_table("critic").to_string(), "config: `critic.num_layers` must be in 1..=4, got 9");
    /// ```
    #[must_use]
    pub fn in_table(self, table: &str) -> Self {
        match self {
            Self::Value {
                arg, expected, got, ..
            } => Self::Value {
                func: "config".into(),
                arg: format!("{table}.{arg}"),
                expected,
                got,
            },
            other => other,
        }
    }

    /// A [`Error::UnknownChoice`] error.
    pub fn unknown_choice(func: &str, arg: &str, allowed: &[&str], got: &str) -> Self {
        Self::UnknownChoice {
            func: func.into(),
            arg: arg.into(),
            allowed: allowed.join(", "),
            got: got.into(),
        }
    }

    /// A [`Error::Missing`] error.
    pub fn missing(func: &str, arg: &str, expected: impl Into<String>) -> Self {
        Self::Missing {
            func: func.into(),
            arg: arg.into(),
            expected: expected.into(),
        }
    }

    /// A [`Error::File`] error.
    pub fn file(path: impl std::fmt::Display, message: impl std::fmt::Display) -> Self {
        Self::File {
            path: path.to_string(),
            message: message.to_string(),
        }
    }

    /// Wraps a candle error raised while `func` was computing.
    pub fn candle(func: &str, source: candle_core::Error) -> Self {
        Self::Candle {
            func: func.into(),
            source,
        }
    }
}

/// Adds the function name to candle errors: `tensor_op().ctx("compute_x")?`.
pub trait CandleContext<T> {
    /// Maps a candle error into [`Error::Candle`] naming `func`.
    fn ctx(self, func: &str) -> Result<T>;
}

impl<T> CandleContext<T> for candle_core::Result<T> {
    fn ctx(self, func: &str) -> Result<T> {
        self.map_err(|e| Error::candle(func, e))
    }
}
