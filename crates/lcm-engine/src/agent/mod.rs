//! The sub-agent loop: a model, a set of tools, a task, and limits.
//!
//! [`run_agent`] asks the model for a turn, runs the tools it calls, gives it their results, and
//! repeats until it answers in text, or a limit ([`AgentLimits`]: steps, tokens, a deadline)
//! stops it, or the provider fails. It is plain library code: the actor runtime decides where it
//! runs and stores the sub-agent's history as an LCM session, from the turns the loop hands to
//! its observer ([`turn_to_message`] converts one into a storable message).
//!
//! The tools are anything implementing [`AgentTools`]; the engine's tool registry is adapted to
//! it. A tool's failure, a call of a tool that does not exist and arguments that are not a JSON
//! object all go back to the model as error results, so that it can correct itself; none of them
//! ends the loop.

mod run;

pub use run::{AgentLimits, AgentOutcome, AgentStop, AgentTools, ConversationWindow, run_agent};

use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::time::Timestamp;
use lcm_llm::ChatTurn;

/// The storable message for one turn of a sub-agent's conversation, created now, with no
/// original (the store keeps it in lcm's own format) and no source key.
///
/// System and user turns become one text part; an assistant turn its text (if any) then one
/// [`Part::ToolCall`] per call, with the arguments as the model wrote them; a tool result a
/// [`Role::Tool`] message with one [`Part::ToolResult`]. An assistant turn with neither text nor
/// calls becomes an empty text part, since the store refuses messages without parts.
pub fn turn_to_message(turn: &ChatTurn) -> NewMessage {
    let (role, parts) = match turn {
        ChatTurn::System(text) => (Role::System, vec![Part::Text { text: text.clone() }]),
        ChatTurn::User(text) => (Role::User, vec![Part::Text { text: text.clone() }]),
        ChatTurn::Assistant { text, tool_calls } => {
            let mut parts = Vec::with_capacity(tool_calls.len() + 1);
            if let Some(text) = text.as_deref().filter(|text| !text.is_empty()) {
                parts.push(Part::Text {
                    text: text.to_owned(),
                });
            }
            parts.extend(tool_calls.iter().map(|call| Part::ToolCall {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            }));
            if parts.is_empty() {
                parts.push(Part::Text {
                    text: String::new(),
                });
            }
            (Role::Assistant, parts)
        }
        ChatTurn::ToolResult {
            call_id,
            content,
            is_error,
        } => (
            Role::Tool,
            vec![Part::ToolResult {
                call_id: call_id.clone(),
                content: content.clone(),
                is_error: *is_error,
            }],
        ),
    };
    NewMessage {
        role,
        parts,
        created_at: Timestamp::now(),
        original: None,
        source_key: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_llm::ToolCall;

    #[test]
    fn turns_become_messages() {
        let system = turn_to_message(&ChatTurn::System("rules".into()));
        assert_eq!(system.role, Role::System);
        assert_eq!(
            system.parts,
            vec![Part::Text {
                text: "rules".into()
            }]
        );
        assert_eq!(
            turn_to_message(&ChatTurn::User("task".into())).role,
            Role::User
        );

        let assistant = turn_to_message(&ChatTurn::Assistant {
            text: Some("Looking.".into()),
            tool_calls: vec![ToolCall::new("c1", "grep", "{not json")],
        });
        assert_eq!(assistant.role, Role::Assistant);
        assert_eq!(
            assistant.parts,
            vec![
                Part::Text {
                    text: "Looking.".into()
                },
                Part::ToolCall {
                    id: "c1".into(),
                    name: "grep".into(),
                    arguments: "{not json".into()
                }
            ]
        );
        assert_eq!(assistant.original, None);
        assert_eq!(assistant.source_key, None);

        let result = turn_to_message(&ChatTurn::tool_error("c1", "bad"));
        assert_eq!(result.role, Role::Tool);
        assert_eq!(
            result.parts,
            vec![Part::ToolResult {
                call_id: "c1".into(),
                content: "bad".into(),
                is_error: true
            }]
        );

        let empty = turn_to_message(&ChatTurn::Assistant {
            text: None,
            tool_calls: vec![],
        });
        assert_eq!(empty.parts.len(), 1);
    }
}
