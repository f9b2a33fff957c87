/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.runtime.leaderelection.LeaderInformation;
import org.apache.flink.runtime.leaderretrieval.LeaderRetrievalDriver;
import org.apache.flink.runtime.leaderretrieval.LeaderRetrievalEventHandler;
import org.apache.flink.runtime.leaderretrieval.LeaderRetrievalException;
import org.apache.flink.runtime.rpc.FatalErrorHandler;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;

import java.util.UUID;

/**
 * {@link LeaderRetrievalDriver} for one component: watches its leader information through the
 * bridge and reports every change, including a cleared one ({@link LeaderInformation#empty()}).
 * The bridge's end clears the information and is a fatal error.
 */
public class JobregLeaderRetrievalDriver
        implements LeaderRetrievalDriver, JobregBridge.EventListener {

    private final JobregBridge bridge;
    private final String componentId;
    private final LeaderRetrievalEventHandler handler;
    private final FatalErrorHandler fatalErrorHandler;
    private volatile boolean running = true;

    public JobregLeaderRetrievalDriver(
            JobregBridge bridge,
            String componentId,
            LeaderRetrievalEventHandler handler,
            FatalErrorHandler fatalErrorHandler)
            throws Exception {
        this.bridge = bridge;
        this.componentId = componentId;
        this.handler = handler;
        this.fatalErrorHandler = fatalErrorHandler;
        bridge.addListener(this);
        try {
            bridge.watch(componentId);
        } catch (JobregBridgeException e) {
            bridge.removeListener(this);
            throw new LeaderRetrievalException("Cannot watch " + componentId + " in jobreg", e);
        }
    }

    /** A {@code leader} event as Flink's leader information (null session: empty). */
    static LeaderInformation toLeaderInformation(JsonNode event) {
        JsonNode session = event.get("session");
        JsonNode address = event.get("address");
        if (session == null || session.isNull() || address == null || address.isNull()) {
            return LeaderInformation.empty();
        }
        return LeaderInformation.known(UUID.fromString(session.asText()), address.asText());
    }

    @Override
    public void onEvent(JsonNode event) {
        if (running
                && "leader".equals(event.path("event").asText())
                && componentId.equals(event.path("component").asText())) {
            handler.notifyLeaderAddress(toLeaderInformation(event));
        }
    }

    @Override
    public void onBridgeClosed(Throwable cause) {
        if (!running) {
            return;
        }
        handler.notifyLeaderAddress(LeaderInformation.empty());
        if (cause != null) {
            fatalErrorHandler.onFatalError(
                    new LeaderRetrievalException("The jobreg bridge has ended", cause));
        }
    }

    @Override
    public void close() {
        if (!running) {
            return;
        }
        running = false;
        bridge.removeListener(this);
        bridge.unwatch(componentId);
    }
}
