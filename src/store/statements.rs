//! The statement driver: how every write command palletd sends is sent
//! again and what a statement's error means ([`super::mongo::decide`]).
//! Three forms, by what the caller can do with a partial success:
//!
//! - **Unordered** ([`Mongo::send_unordered`]): statements that do not
//!   depend on each other, sent in as few commands as the server's limits
//!   allow; a statement refused for now (a transient code, an upsert that
//!   raced another to its `_id`) is sent again after a backoff, one
//!   refused for good is handed back. What happens to a command whose
//!   answer is lost is the caller's ([`Lost`]). The readings of time
//!   series mode, the dead letters, the latest values and the rollups'
//!   queue entries.
//! - **Ordered** ([`Mongo::send_ordered`]): the buckets' upserts, where
//!   what an ordered command applied is a prefix per sensor; the caller
//!   goes on from the refused statement (again after a backoff, into the
//!   window's next bucket with the statements after it planned anew, or
//!   given up: `buckets/write.rs`).
//! - **Once** ([`send_once`]): the seal, the published checkpoint and the
//!   rollup passes, each tried again as a whole at its next run.

use bson::RawDocumentBuf;
use mongodb::Database;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::mongo::{
    count_statement_error, decide, Decision, Failure, Mongo, Reply, RetryAction, WriteError,
    DUPLICATE_KEY,
};
use crate::retry::{Aborted, Backoff};

/// What an ordered command did ([`Mongo::send_ordered`]).
#[derive(Debug)]
pub(crate) enum Ordered {
    /// No answer: any prefix of its `len` statements may be applied.
    Lost { len: usize },
    /// Its first `applied` statements were applied (`upserted`: those of
    /// them whose upsert inserted a document); `refused`: the statement
    /// after them, with what its error means.
    Answered {
        applied: usize,
        upserted: Vec<usize>,
        refused: Option<(WriteError, Decision)>,
    },
}

/// What a command whose answer was lost means for its statements (the
/// server may have applied any of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// Sent again after a backoff: they are idempotent.
    Resend,
    /// Handed back as unknown ([`Sent::unknown`]), and those after them
    /// as not sent: the caller learns what was applied first.
    HandBack,
}

/// Whose `_id` the statements carry, which says what a duplicate key on
/// it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ids {
    /// The server's: a duplicate key is on an index of the operator's,
    /// refusing the statement for good.
    Server,
    /// Inserts of documents whose `_id` says what they are: a duplicate
    /// on it is the document already there (an earlier attempt), applied.
    Inserted,
    /// Upserts by `_id`: a duplicate on it is an upsert that raced another
    /// to it, sent again.
    Upserted,
}

/// An unordered write: `{<command>: <collection>, <field>: [...]}`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unordered<'a> {
    /// For the log ("Cannot {what}").
    pub what: &'a str,
    pub command: &'a str,
    pub collection: &'a str,
    pub field: &'a str,
    pub ids: Ids,
    pub lost: Lost,
}

/// What became of an unordered write's statements, by their index; every
/// statement not named here was applied.
#[derive(Debug, Default)]
pub(crate) struct Sent {
    /// Refused for good, in index order (each error's `index` is the
    /// statement's).
    pub refused: Vec<WriteError>,
    /// The command that carried them got no answer ([`Lost::HandBack`]).
    pub unknown: Vec<usize>,
    /// Not sent: after a command whose answer was lost.
    pub unsent: Vec<usize>,
    /// Statements in the commands the server answered (resent ones each
    /// time).
    pub answered: u64,
}

impl Unordered<'_> {
    /// Whether a statement the server refused is sent again (`false`:
    /// refused for good), `None` when it is in fact applied.
    fn again(&self, error: &WriteError) -> Option<bool> {
        let on_id = error.code == DUPLICATE_KEY && error.duplicate_on_id;
        let decision = match self.ids {
            Ids::Inserted if on_id => return None,
            Ids::Upserted if on_id => Decision::RetryStatement,
            ids => decide(Failure::Statement {
                error,
                by_id: ids != Ids::Server,
            }),
        };
        Some(decision == Decision::RetryStatement)
    }
}

impl Mongo {
    /// Sends the write command `build` makes (with how many statements it
    /// holds) until it gets a reply: one that certainly was not applied is
    /// built and sent again after a backoff. The reply is `None` when the
    /// command may or may not have been applied.
    async fn write_until_answered(
        &mut self,
        what: &str,
        backoff: &mut Backoff,
        abort: &CancellationToken,
        build: impl Fn(&Mongo) -> (usize, RawDocumentBuf),
    ) -> Result<(usize, Option<Reply>), Aborted> {
        loop {
            let (len, cmd) = build(self);
            match self.write(cmd, what).await {
                Ok(reply) => return Ok((len, Some(reply))),
                Err(RetryAction::Retry) => self.wait(backoff, abort).await?,
                Err(RetryAction::Ambiguous) => return Ok((len, None)),
            }
        }
    }

    /// Sends the ordered write command `build` makes until it is answered
    /// and reads the answer: what an ordered command applied is a prefix.
    /// The caller goes on from the refused statement as its [`Decision`]
    /// says (`by_id`: the statements upsert documents by their `_id`).
    pub(crate) async fn send_ordered(
        &mut self,
        what: &str,
        by_id: bool,
        backoff: &mut Backoff,
        abort: &CancellationToken,
        build: impl Fn(&Mongo) -> (usize, RawDocumentBuf),
    ) -> Result<Ordered, Aborted> {
        let (len, reply) = self
            .write_until_answered(what, backoff, abort, build)
            .await?;
        let Some(reply) = reply else {
            return Ok(Ordered::Lost { len });
        };
        let refused = reply.write_errors.into_iter().next();
        let applied = refused.as_ref().map_or(len, |e| e.index);
        let refused = refused.map(|error| {
            let decision = decide(Failure::Statement {
                error: &error,
                by_id,
            });
            (error, decision)
        });
        Ok(Ordered::Answered {
            applied,
            upserted: reply.upserted,
            refused,
        })
    }

    /// Sends statements `0..len` (`statement(i)` builds the i-th, again
    /// for each attempt) as `w` says, until each is applied, refused for
    /// good or, with [`Lost::HandBack`], unknown.
    pub(crate) async fn send_unordered(
        &mut self,
        w: Unordered<'_>,
        len: usize,
        statement: impl Fn(usize) -> RawDocumentBuf,
        abort: &CancellationToken,
    ) -> Result<Sent, Aborted> {
        let mut backoff = Backoff::default();
        let mut sent = Sent::default();
        let mut todo: Vec<usize> = (0..len).collect();
        while !todo.is_empty() {
            let (batch_len, reply) = self
                .write_until_answered(w.what, &mut backoff, abort, |m| {
                    let docs = todo.iter().map(|&i| statement(i));
                    m.batch_command(w.command, w.collection, w.field, docs, false)
                })
                .await?;
            let Some(reply) = reply else {
                match w.lost {
                    Lost::Resend => self.wait(&mut backoff, abort).await?,
                    Lost::HandBack => {
                        sent.unknown.extend_from_slice(&todo[..batch_len]);
                        sent.unsent.extend_from_slice(&todo[batch_len..]);
                        todo.clear();
                    }
                }
                continue;
            };
            sent.answered += batch_len as u64;
            let mut again = Vec::new();
            for e in reply.write_errors {
                let index = todo[e.index];
                match w.again(&e) {
                    None => {}
                    Some(true) => {
                        count_statement_error(Decision::RetryStatement);
                        again.push(index);
                    }
                    Some(false) => {
                        count_statement_error(Decision::GiveUp);
                        sent.refused.push(WriteError { index, ..e });
                    }
                }
            }
            let transient = !again.is_empty();
            again.extend_from_slice(&todo[batch_len..]);
            todo = again;
            if transient {
                debug!(
                    what = w.what,
                    "Statements refused for now; sending them again."
                );
                self.wait(&mut backoff, abort).await?;
            } else {
                backoff.reset();
            }
        }
        sent.refused.sort_by_key(|e| e.index);
        sent.unknown.sort_unstable();
        sent.unsent.sort_unstable();
        Ok(sent)
    }
}

/// Sends one write command outside the writer's retries, with the
/// configured write `concern` ([`super::mongo::write_concern`]): the
/// closer's seal and published checkpoint, the rollup passes (each is
/// tried again as a whole at its next run). Its reply parsed; a write
/// concern error is an error (the server may not keep what it applied),
/// like a failed command.
pub(crate) async fn send_once(
    db: &Database,
    concern: &bson::Document,
    mut cmd: bson::Document,
    what: &str,
) -> mongodb::error::Result<Reply> {
    cmd.insert("writeConcern", concern.clone());
    let reply = Reply::parse(&db.run_command(cmd).await?);
    if let Some(wce) = &reply.write_concern_error {
        return Err(mongodb::error::Error::custom(format!("{what}: {wce}")));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: i32, duplicate_on_id: bool) -> WriteError {
        WriteError {
            index: 0,
            code,
            msg: String::new(),
            duplicate_on_id,
        }
    }

    fn write(ids: Ids) -> Unordered<'static> {
        Unordered {
            what: "test",
            command: "update",
            collection: "c",
            field: "updates",
            ids,
            lost: Lost::Resend,
        }
    }

    /// A duplicate `_id` is the document already there for an insert of
    /// palletd's, a race for an upsert, a refusal where the server makes
    /// the ids; a duplicate on another index and an unknown code are
    /// refusals, a transient code is sent again, for all three.
    #[test]
    fn what_a_statement_error_means_by_whose_id_it_carries() {
        let on_id = error(DUPLICATE_KEY, true);
        let on_other = error(DUPLICATE_KEY, false);
        let transient = error(112, false);
        let other = error(2, false);
        let cases = [
            (Ids::Inserted, [None, Some(false), Some(true), Some(false)]),
            (
                Ids::Upserted,
                [Some(true), Some(false), Some(true), Some(false)],
            ),
            (
                Ids::Server,
                [Some(false), Some(false), Some(true), Some(false)],
            ),
        ];
        for (ids, want) in cases {
            let w = write(ids);
            let got = [&on_id, &on_other, &transient, &other].map(|e| w.again(e));
            assert_eq!(got, want, "{ids:?}");
        }
    }
}
