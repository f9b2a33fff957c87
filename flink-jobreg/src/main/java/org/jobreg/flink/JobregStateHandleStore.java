/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.core.fs.FileSystem;
import org.apache.flink.core.fs.Path;
import org.apache.flink.runtime.persistence.IntegerResourceVersion;
import org.apache.flink.runtime.persistence.PossibleInconsistentStateException;
import org.apache.flink.runtime.persistence.RetrievableStateStorageHelper;
import org.apache.flink.runtime.persistence.StateHandleStore;
import org.apache.flink.runtime.state.RetrievableStateHandle;
import org.apache.flink.runtime.state.RetrievableStreamStateHandle;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;

/**
 * {@link StateHandleStore} over one of jobreg's stores ({@code plans}, {@code applications},
 * {@code checkpoints/<job>}).
 *
 * <p>The state itself is written by Flink's storage helper (a file under {@code
 * high-availability.storageDir}); only the pointer, the file's path, goes into jobreg's log, as a
 * write fenced by this process's leadership term. A write whose outcome is unknown throws {@link
 * PossibleInconsistentStateException} and keeps the file (the pointer may be in the log); a write
 * that certainly failed discards it. The lock methods are no-ops, as in Flink's Kubernetes
 * backend: a term, not a lock node, protects the entries.
 */
public class JobregStateHandleStore<T extends Serializable>
        implements StateHandleStore<T, IntegerResourceVersion> {

    private static final Logger LOG = LoggerFactory.getLogger(JobregStateHandleStore.class);

    private final JobregBridge bridge;
    private final String store;
    private final RetrievableStateStorageHelper<T> storage;
    private final int retained;

    public JobregStateHandleStore(
            JobregBridge bridge, String store, RetrievableStateStorageHelper<T> storage) {
        this(bridge, store, storage, 0);
    }

    /**
     * A store whose adds name how many entries the store above keeps ({@code retained}, sent
     * with each {@code store_add}): for a job's completed checkpoints, the {@code
     * maxNumberOfCheckpointsToRetain} Flink built its checkpoint store with ({@code
     * state.checkpoints.num-retained}), which jobreg's fold then keeps across failover and
     * compaction. 0: jobreg's own count for the store.
     */
    public JobregStateHandleStore(
            JobregBridge bridge,
            String store,
            RetrievableStateStorageHelper<T> storage,
            int retained) {
        if (retained < 0) {
            throw new IllegalArgumentException("retained must be >= 0, not " + retained);
        }
        this.bridge = bridge;
        this.store = store;
        this.storage = storage;
        this.retained = retained;
    }

    public String getStoreName() {
        return store;
    }

    private ObjectNode request(String op, String name) {
        ObjectNode request = JobregBridge.request(op);
        request.put("store", store);
        if (name != null) {
            request.put("name", name);
        }
        return request;
    }

    @Override
    public RetrievableStateHandle<T> addAndLock(String name, T state)
            throws PossibleInconsistentStateException, Exception {
        RetrievableStateHandle<T> handle = storage.store(state);
        ObjectNode request = request("store_add", name);
        request.put("pointer", pointerOf(handle));
        if (retained > 0) {
            request.put("retained", retained);
        }
        try {
            bridge.call(request);
            return handle;
        } catch (JobregBridgeException e) {
            throw afterFailedWrite(e, handle, name);
        }
    }

    @Override
    public void replace(String name, IntegerResourceVersion resourceVersion, T state)
            throws PossibleInconsistentStateException, Exception {
        RetrievableStateHandle<T> old = getAndLock(name);
        RetrievableStateHandle<T> handle = storage.store(state);
        ObjectNode request = request("store_replace", name);
        request.put("version", resourceVersion.getValue());
        request.put("pointer", pointerOf(handle));
        try {
            bridge.call(request);
        } catch (JobregBridgeException e) {
            throw afterFailedWrite(e, handle, name);
        }
        discard(old, name);
    }

    /** Maps a failed write to Flink's exception; discards the new file unless it may be used. */
    private Exception afterFailedWrite(
            JobregBridgeException e, RetrievableStateHandle<T> handle, String name) {
        if (e.isOutcomeUnknown()) {
            // The pointer may be in the log: the file must stay.
            return new PossibleInconsistentStateException(e);
        }
        discard(handle, name);
        switch (e.getKind()) {
            case JobregBridgeException.ALREADY_EXISTS:
                return new AlreadyExistException(
                        "'" + name + "' already exists in " + store + ": " + e.getMessage());
            case JobregBridgeException.NOT_EXIST:
                return new NotExistException(
                        "'" + name + "' does not exist in " + store + ": " + e.getMessage());
            case JobregBridgeException.INVALID:
                return new UnsupportedOperationException(e.getMessage(), e);
            case JobregBridgeException.FENCED:
            case JobregBridgeException.NOT_LEADER:
                return new Exception("not the leader: " + e.getMessage(), e);
            default:
                return e;
        }
    }

    @Override
    public IntegerResourceVersion exists(String name) throws Exception {
        int version = bridge.call(request("store_exists", name)).path("version").asInt(-1);
        return version < 0
                ? IntegerResourceVersion.notExisting()
                : IntegerResourceVersion.valueOf(version);
    }

    @Override
    public RetrievableStateHandle<T> getAndLock(String name) throws Exception {
        try {
            JsonNode result = bridge.call(request("store_get", name));
            return handleOf(result.path("pointer").asText());
        } catch (JobregBridgeException e) {
            if (JobregBridgeException.NOT_EXIST.equals(e.getKind())) {
                throw new NotExistException("'" + name + "' does not exist in " + store);
            }
            throw e;
        }
    }

    @Override
    public List<Tuple2<RetrievableStateHandle<T>, String>> getAllAndLock() throws Exception {
        JsonNode all = bridge.call(request("store_all", null));
        List<Tuple2<RetrievableStateHandle<T>, String>> entries = new ArrayList<>();
        for (JsonNode entry : all) {
            entries.add(
                    Tuple2.of(
                            handleOf(entry.path("pointer").asText()),
                            entry.path("name").asText()));
        }
        return entries;
    }

    @Override
    public Collection<String> getAllHandles() throws Exception {
        JsonNode names = bridge.call(request("store_names", null));
        List<String> result = new ArrayList<>();
        for (JsonNode name : names) {
            result.add(name.asText());
        }
        return result;
    }

    /**
     * Removes the entry, then discards its state; false (and nothing discarded) when jobreg keeps
     * the entry.
     */
    @Override
    public boolean releaseAndTryRemove(String name) throws Exception {
        RetrievableStateHandle<T> handle;
        try {
            handle = getAndLock(name);
        } catch (NotExistException e) {
            return true;
        }
        boolean removed;
        try {
            removed = bridge.call(request("store_remove", name)).path("removed").asBoolean(true);
        } catch (JobregBridgeException e) {
            if (e.isOutcomeUnknown()) {
                throw new PossibleInconsistentStateException(e);
            }
            if (e.isNotLeader()) {
                throw new Exception("not the leader: " + e.getMessage(), e);
            }
            throw e;
        }
        if (!removed) {
            // jobreg keeps the entry (the fold retains a live job's newest checkpoints): the
            // state stays too, and Flink keeps the checkpoint's files.
            return false;
        }
        discard(handle, name);
        return true;
    }

    @Override
    public void clearEntries() throws Exception {
        bridge.call(request("store_clear", null));
    }

    @Override
    public void release(String name) {
        // No locks: a term of jobreg's log protects the entries.
    }

    @Override
    public void releaseAll() {
        // No locks: a term of jobreg's log protects the entries.
    }

    // ------------------------------------------------------------------------------------------

    /** The file behind a handle written by Flink's FileSystemStateStorageHelper. */
    static String pointerOf(RetrievableStateHandle<?> handle) {
        if (handle instanceof RetrievableStreamStateHandle) {
            java.util.Optional<Path> path = ((RetrievableStreamStateHandle<?>) handle).maybeGetPath();
            if (path.isPresent()) {
                return path.get().toString();
            }
        }
        throw new IllegalArgumentException(
                "jobreg stores file pointers only; the storage helper gave " + handle);
    }

    private RetrievableStateHandle<T> handleOf(String pointer) {
        Path path = new Path(pointer);
        long size = 0;
        try {
            FileSystem fs = path.getFileSystem();
            size = fs.getFileStatus(path).getLen();
        } catch (IOException e) {
            // The size is only reported in metrics; a missing file fails when it is read.
            LOG.debug("Cannot stat {}", pointer, e);
        }
        return new RetrievableStreamStateHandle<>(path, size);
    }

    private void discard(RetrievableStateHandle<T> handle, String name) {
        try {
            handle.discardState();
        } catch (Exception e) {
            LOG.warn("Could not discard the state of '{}' in {}", name, store, e);
        }
    }

    @Override
    public String toString() {
        return getClass().getSimpleName() + "{store='" + store + "'}";
    }
}
