/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

/**
 * An error answer of the jobreg bridge: its kind (the protocol's error kinds: {@code
 * OutcomeUnknown}, {@code Fenced}, {@code NotLeader}, {@code AlreadyExists}, {@code NotExist},
 * {@code Invalid}, {@code Unavailable}, {@code Internal}) and its one-line message. The bridge's
 * death fails every pending request with kind {@code Unavailable}.
 */
public class JobregBridgeException extends Exception {

    private static final long serialVersionUID = 1L;

    /** The write may or may not be in the log. */
    public static final String OUTCOME_UNKNOWN = "OutcomeUnknown";
    /** A newer term exists; the write is certainly not applied. */
    public static final String FENCED = "Fenced";
    /** This bridge holds no term; nothing was sent. */
    public static final String NOT_LEADER = "NotLeader";
    /** The name or job is already there. */
    public static final String ALREADY_EXISTS = "AlreadyExists";
    /** Unknown name or job. */
    public static final String NOT_EXIST = "NotExist";
    /** A bad request. */
    public static final String INVALID = "Invalid";
    /** The broker (or the bridge) is unreachable; nothing was written. */
    public static final String UNAVAILABLE = "Unavailable";

    private final String kind;

    public JobregBridgeException(String kind, String message) {
        super(kind + ": " + message);
        this.kind = kind;
    }

    public String getKind() {
        return kind;
    }

    /** True when the bridge refused the write because this process does not lead. */
    public boolean isNotLeader() {
        return FENCED.equals(kind) || NOT_LEADER.equals(kind);
    }

    public boolean isOutcomeUnknown() {
        return OUTCOME_UNKNOWN.equals(kind);
    }
}
