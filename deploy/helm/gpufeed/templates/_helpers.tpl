{{/* Name of the chart's objects: the release name when it contains "gpufeed", else <release>-gpufeed. */}}
{{- define "gpufeed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpufeed.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpufeed.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "gpufeed.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpufeed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpufeed.labels" -}}
{{ include "gpufeed.selectorLabels" . }}
app.kubernetes.io/component: exporter
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpufeed.webConfigSecret" -}}
{{- default (printf "%s-web-config" (include "gpufeed.fullname" .)) .Values.webConfig.existingSecret -}}
{{- end -}}

{{- define "gpufeed.webConfigEnabled" -}}
{{- if or .Values.webConfig.existingSecret .Values.webConfig.config -}}true{{- end -}}
{{- end -}}
